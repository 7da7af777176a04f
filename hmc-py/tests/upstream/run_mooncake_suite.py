"""Runs Mooncake's own wheel tests of its Transfer Engine (``mooncake-wheel/tests/
transfer_engine_target.py`` and ``transfer_engine_initiator_test.py``) against
``hmc.mooncake``, with only their import line rewritten (``from mooncake.engine import
TransferEngine`` -> ``from hmc.mooncake import TransferEngine``; the diff is printed).

Their code is not in this repository: it is read from a Mooncake source, ``--src`` or
``$HMC_MOONCAKE_SRC`` (a checkout, or a bare git directory read at ``--ref`` or
``$HMC_MOONCAKE_REF``, default ``HEAD``; by default the mirror at
``/work/.mirror/kvcache-ai+Mooncake/repo`` when it is there), and
copied into a temporary directory that is removed afterwards.

They run as Mooncake's CI runs them (``scripts/run_tests.sh``): the target in the background,
the initiator's unittest suite in the foreground, ``PROTOCOL=tcp``, the metadata server in
``MC_METADATA_SERVER``; the target is killed at the end. Two metadata servers, each a run:
``etcd`` (a bare ``host:port``, an etcd started on a free loopback port) and ``http``
(``http://127.0.0.1:PORT/metadata`` with ``MC_FORCE_TCP=true``, exactly as the CI; the server
is ``../mooncake_http_metadata_server.py``, or Mooncake's own with ``--http-server mooncake``).
The one addition: the initiator starts once the target has printed that it is ready (the CI
starts both at once and relies on the target being faster).

``--alias`` runs the unmodified files on ``hmc.mooncake`` through ``HMC_ALIAS=mooncake``
(``import mooncake.engine`` resolving to it, as the README tells unmodified code to run).
``--real`` runs the unmodified files on Mooncake itself, with the interpreter in
``$HMC_MOONCAKE_PYTHON`` (``mooncake-transfer-engine-non-cuda==0.3.13.post1``; ``cargo xtask``
makes one in ``target/mooncake-venv``), to keep the baseline honest.

Prints ``N passed of M`` per run and in all; exits 0 only when every test of every run passed
(2 when the Mooncake source or an interpreter is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from etcd_server import EtcdMissing, free_port, running_etcd  # noqa: E402

DEFAULT_SRC = "/work/.mirror/kvcache-ai+Mooncake/repo"
TESTS_DIR = "mooncake-wheel/tests"
TARGET = "transfer_engine_target.py"
INITIATOR = "transfer_engine_initiator_test.py"
UPSTREAM_IMPORT = "from mooncake.engine import TransferEngine"
HMC_IMPORT = "from hmc.mooncake import TransferEngine"
READY_LINE = "Target server ready"
HTTP_SERVER = os.path.join(os.path.dirname(HERE), "mooncake_http_metadata_server.py")
# Bounds: the target's start, the initiator's whole suite, a server's start, a process's stop.
TARGET_READY_S = 60
SUITE_TIMEOUT_S = 600
SERVER_START_S = 30
STOP_GRACE_S = 5
# The largest upstream file read (they are a few KiB).
MAX_SOURCE_BYTES = 1 << 20
# Lines of a failing process's output shown.
TAIL_LINES = 60

# Runs the initiator's suite as its `unittest.main()` does, and prints what passed.
DRIVER = """
import sys, unittest
class Result(unittest.TextTestResult):
    passed = []
    def addSuccess(self, test):
        super().addSuccess(test)
        Result.passed.append(test.id().rsplit(".", 1)[-1])
suite = unittest.defaultTestLoader.loadTestsFromName(sys.argv[1])
total = suite.countTestCases()
unittest.TextTestRunner(verbosity=2, resultclass=Result).run(suite)
print(f"SUITE {len(Result.passed)} {total} {' '.join(Result.passed)}", flush=True)
"""


class Missing(Exception):
    """The Mooncake source or an interpreter is not there."""


def read_upstream(src: str, ref: str, name: str) -> str:
    """The text of ``mooncake-wheel/tests/<name>`` in ``src`` (a checkout or a bare git
    directory, read at ``ref``)."""
    path = f"{TESTS_DIR}/{name}"
    if os.path.isfile(os.path.join(src, path)):
        with open(os.path.join(src, path), "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    elif os.path.isfile(os.path.join(src, "HEAD")):
        got = subprocess.run(["git", "--git-dir", src, "show", f"{ref}:{path}"], capture_output=True, timeout=60)
        if got.returncode != 0:
            raise Missing(f"{src} has no {path} at {ref}: {got.stderr.decode(errors='replace').strip()}")
        data = got.stdout
    else:
        raise Missing(f"{src} is neither a Mooncake checkout nor a bare git directory")
    if len(data) > MAX_SOURCE_BYTES:
        raise Missing(f"{path} is over {MAX_SOURCE_BYTES} bytes (MAX_SOURCE_BYTES): not Mooncake's test")
    return data.decode()


def rewrite(name: str, text: str) -> str:
    """``text`` with its one import line of Mooncake's engine made hmc.mooncake's; prints
    the diff. Refuses a file without exactly one such line (the upstream file changed)."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == UPSTREAM_IMPORT]
    if len(hits) != 1:
        raise SystemExit(f"{name}: expected one line `{UPSTREAM_IMPORT}`, found {len(hits)}; "
                         "the upstream file changed, and this runner rewrites nothing else")
    out = list(lines)
    out[hits[0]] = lines[hits[0]].replace(UPSTREAM_IMPORT, HMC_IMPORT)
    sys.stdout.writelines(difflib.unified_diff(lines, out, f"upstream/{name}", f"rewritten/{name}"))
    return "".join(out)


class Proc:
    """A child process in its own session, its output collected by a thread."""

    def __init__(self, argv, cwd, env):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                self._reader.join(STOP_GRACE_S)
                return any(text in line for line in self.lines)
            time.sleep(0.05)
        return False

    def tail(self) -> str:
        return "".join(self.lines[-TAIL_LINES:])

    def stop(self):
        """SIGTERM to its process group, SIGKILL after STOP_GRACE_S; reaped."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(STOP_GRACE_S)
        self.proc.stdout.close()


@contextlib.contextmanager
def http_server(kind: str, mooncake_python: str | None):
    """A metadata server speaking Mooncake's HTTP protocol on a free loopback port: its URI."""
    port = free_port()
    if kind == "mooncake":
        if not mooncake_python:
            raise Missing("--http-server mooncake needs HMC_MOONCAKE_PYTHON")
        argv = [mooncake_python, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1", "--port", str(port)]
    else:
        argv = [sys.executable, HTTP_SERVER, "--port", str(port)]
    server = Proc(argv, HERE, os.environ.copy())
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the metadata server did not start:\n{server.tail()}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/metadata"
    finally:
        server.stop()


@contextlib.contextmanager
def metadata_server(mode: str, http_kind: str, mooncake_python: str | None):
    """(MC_METADATA_SERVER, extra environment) for ``mode``."""
    if mode == "etcd":
        with running_etcd() as endpoint:
            yield endpoint, {}
    else:
        with http_server(http_kind, mooncake_python) as uri:
            yield uri, {"MC_FORCE_TCP": "true"}


@dataclasses.dataclass
class Setup:
    """What every run shares: the interpreter, the directory of the files, the HTTP server
    kind, Mooncake's interpreter (for its server), CIRCLE, the suite's test count (the total
    when it did not get to run) and the alias to set (``HMC_ALIAS``), if any."""

    python: str
    workdir: str
    http_kind: str
    mooncake_python: str | None
    circle: int | None
    expected: int
    alias: str | None


def run_once(setup: Setup, mode: str) -> tuple[int, int]:
    """One run of target and initiator over the metadata server ``mode``: (passed, total)."""
    python, workdir, expected = setup.python, setup.workdir, setup.expected
    with metadata_server(mode, setup.http_kind, setup.mooncake_python) as (server, extra):
        env = dict(os.environ, PYTHONUNBUFFERED="1", PROTOCOL="tcp", MC_METADATA_SERVER=server,
                   TARGET_SERVER_NAME=f"127.0.0.1:{free_port()}",
                   INITIATOR_SERVER_NAME=f"127.0.0.1:{free_port()}", **extra)
        env.pop("HMC_ALIAS", None)
        if setup.alias:
            env["HMC_ALIAS"] = setup.alias
        if setup.circle is not None:
            env["CIRCLE"] = str(setup.circle)
        print(f"== {mode}: MC_METADATA_SERVER={server} PROTOCOL=tcp"
              + "".join(f" {k}={v}" for k, v in extra.items()), flush=True)
        target = Proc([python, TARGET], workdir, env)
        try:
            if not target.wait_for(READY_LINE, TARGET_READY_S):
                if target.proc.poll() is None:  # an exit is told below, with its output
                    print(f"the target ran {TARGET_READY_S} s (TARGET_READY_S) without printing "
                          f"`{READY_LINE}`:\n{target.tail()}")
                return 0, expected
            initiator = Proc([python, "-c", DRIVER, INITIATOR.removesuffix(".py")], workdir, env)
            try:
                initiator.proc.wait(SUITE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"the initiator ran over {SUITE_TIMEOUT_S} s (SUITE_TIMEOUT_S)")
            initiator.stop()
            sys.stdout.write(initiator.tail())
            summary = [line for line in initiator.lines if line.startswith("SUITE ")]
            if not summary:
                return 0, expected
            _, passed, total, *_ = summary[-1].split()
            return int(passed), int(total)
        finally:
            target.stop()
            if target.proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
                print(f"the target exited with {target.proc.returncode}:\n{target.tail()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--real", action="store_true", help="run the unmodified files on Mooncake ($HMC_MOONCAKE_PYTHON)")
    how.add_argument("--alias", action="store_true",
                     help="run the unmodified files on hmc.mooncake through HMC_ALIAS=mooncake")
    ap.add_argument("--metadata", choices=["etcd", "http", "both"], default="both")
    ap.add_argument("--http-server", choices=["ours", "mooncake"], default="ours",
                    help="which HTTP metadata server (mooncake: Mooncake's, from $HMC_MOONCAKE_PYTHON)")
    ap.add_argument("--circle", type=int, help="CIRCLE for the initiator (upstream's default: 1000)")
    ap.add_argument("--src", help="the Mooncake source (default: $HMC_MOONCAKE_SRC, else the mirror)")
    ap.add_argument("--ref", help="the revision of a bare git source (default: $HMC_MOONCAKE_REF, else HEAD)")
    args = ap.parse_args()

    src = args.src or os.environ.get("HMC_MOONCAKE_SRC") or (DEFAULT_SRC if os.path.isdir(DEFAULT_SRC) else "")
    ref = args.ref or os.environ.get("HMC_MOONCAKE_REF", "HEAD")
    mooncake_python = os.environ.get("HMC_MOONCAKE_PYTHON")
    try:
        if not src:
            raise Missing(f"no Mooncake source: set HMC_MOONCAKE_SRC (a checkout or bare git directory; "
                          f"{DEFAULT_SRC} is not there)")
        if args.real and not mooncake_python:
            raise Missing("--real needs HMC_MOONCAKE_PYTHON (an interpreter with mooncake-transfer-engine 0.3.13)")
        texts = {name: read_upstream(src, ref, name) for name in (TARGET, INITIATOR)}
    except Missing as e:
        print(f"run_mooncake_suite: {e}", file=sys.stderr)
        return 2
    python = mooncake_python if args.real else sys.executable
    on = "Mooncake" if args.real else "hmc.mooncake (HMC_ALIAS)" if args.alias else "hmc.mooncake"
    where = src if os.path.isfile(os.path.join(src, TESTS_DIR, TARGET)) else f"{src} at {ref}"
    print(f"Mooncake's wheel tests from {where}, on {on} ({python})")
    modes = ["etcd", "http"] if args.metadata == "both" else [args.metadata]
    results = []
    with tempfile.TemporaryDirectory(prefix="hmc-mooncake-suite-") as workdir:
        for name, text in texts.items():
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text if args.real or args.alias else rewrite(name, text))
        setup = Setup(python, workdir, args.http_server, mooncake_python, args.circle,
                      len(re.findall(r"^\s+def test_", texts[INITIATOR], re.M)), "mooncake" if args.alias else None)
        for mode in modes:
            try:
                passed, total = run_once(setup, mode)
            except (EtcdMissing, Missing) as e:
                print(f"run_mooncake_suite: {e}", file=sys.stderr)
                return 2
            print(f"== {mode}: {passed} passed of {total}", flush=True)
            results.append((passed, total))
    passed, total = sum(p for p, _ in results), sum(t for _, t in results)
    print(f"Mooncake's wheel tests on {on}: {passed} passed of {total}")
    return 0 if total and passed == total and all(t for _, t in results) else 1


if __name__ == "__main__":
    sys.exit(main())
