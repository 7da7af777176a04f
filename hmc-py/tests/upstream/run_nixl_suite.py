"""Runs NIXL's own Python API tests (``test/python/test_nixl_api.py`` and its
``conftest.py``) against ``hmc.nixl``, or against the real NIXL with ``--real``, with only
their import lines rewritten.

NIXL's code is not part of this repository: the runner reads it from a NIXL source tree
(``--src``, or ``HMC_NIXL_SRC``: a checkout, or a bare git repository read at ``--rev``,
default ``HEAD``), copies the two files into a temporary folder, rewrites the lines that
import ``nixl`` (printing each change), and runs pytest there with NIXL's ``--backend``.
Exit status: pytest's. Tests that pass on NIXL and fail on hmc are the work-alike's bugs,
or differences the behaviour table of docs/guide/port-from-nixl-mooncake.md names.

    python run_nixl_suite.py --src ~/nixl                 # hmc.nixl, this interpreter
    python run_nixl_suite.py --src ~/nixl --real          # NIXL (package nixl_cu12)

The interpreter needs pytest, pytest-timeout, numpy and torch (NIXL's test imports it), and
hmc (or ``nixl_cu12`` with ``--real``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Where the suite lives in NIXL's tree.
SUITE = ("test/python/test_nixl_api.py", "test/python/conftest.py")
# What `import nixl...` becomes: hmc's work-alike, or the real wheel's module name.
TARGETS = {"hmc": "hmc.nixl", "real": "nixl_cu12"}
# An import statement of the package `nixl` (and only that package).
IMPORT = re.compile(r"^(\s*)(import|from)\s+nixl(?=[.\s])")
# The most bytes read of one suite file (a named bound on what the source tree hands us).
MAX_FILE_BYTES = 4 << 20


def read(src: str, rev: str, path: str) -> str:
    """``path`` of the NIXL tree at ``src``: a checkout's file, or a bare repository's
    blob at ``rev``."""
    on_disk = os.path.join(src, path)
    if os.path.isfile(on_disk):
        with open(on_disk, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    else:
        done = subprocess.run(["git", "-C", src, "show", f"{rev}:{path}"], capture_output=True, timeout=60)
        if done.returncode != 0:
            sys.exit(f"run_nixl_suite: {path} is not in {src} at {rev}: {done.stderr.decode().strip()}")
        raw = done.stdout
    if len(raw) > MAX_FILE_BYTES:
        sys.exit(f"run_nixl_suite: {path} is larger than MAX_FILE_BYTES ({MAX_FILE_BYTES})")
    return raw.decode()


def rewrite(text: str, module: str, name: str) -> str:
    """``text`` with each import of ``nixl`` importing ``module`` instead (said on stdout)."""
    out = []
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        new = IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {module}", line)
        if new != line:
            print(f"  {name}:{n}: {line.strip()}  ->  {new.strip()}")
        out.append(new)
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.environ.get("HMC_NIXL_SRC"), help="NIXL's source tree (HMC_NIXL_SRC)")
    ap.add_argument("--rev", default="HEAD", help="the revision of a bare repository")
    ap.add_argument("--real", action="store_true", help="run against NIXL itself (nixl_cu12)")
    ap.add_argument("--backend", default="UCX", help="NIXL's --backend (default UCX)")
    ap.add_argument("pytest_args", nargs="*", help="more arguments for pytest")
    a = ap.parse_args()
    if not a.src:
        sys.exit("run_nixl_suite: give NIXL's source tree with --src or HMC_NIXL_SRC")
    module = TARGETS["real" if a.real else "hmc"]
    with tempfile.TemporaryDirectory(prefix="hmc-nixl-suite-") as tmp:
        print(f"NIXL's suite from {a.src} ({a.rev}) against {module}; import lines rewritten:")
        for path in SUITE:
            name = os.path.basename(path)
            with open(os.path.join(tmp, name), "w") as f:
                f.write(rewrite(read(a.src, a.rev, path), module, name))
        env = dict(os.environ)
        # The work-alike's agents talk over tcp on loopback here; NIXL's pick UCX's own.
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--backend", a.backend,
               "-rfEs", os.path.join(tmp, "test_nixl_api.py"), *a.pytest_args]
        done = subprocess.run(cmd, cwd=tmp, env=env)
        shutil.rmtree(os.path.join(tmp, "__pycache__"), ignore_errors=True)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
