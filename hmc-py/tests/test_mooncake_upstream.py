"""Mooncake's own wheel tests of its Transfer Engine, on ``hmc.mooncake`` with only the
import line rewritten (``upstream/run_mooncake_suite.py``: etcd and HTTP metadata servers),
unmodified on it through ``HMC_ALIAS=mooncake``, and unmodified on Mooncake 0.3.13 when an interpreter with it is given
(``HMC_MOONCAKE_PYTHON``). Their code is read from a Mooncake source (``HMC_MOONCAKE_SRC``,
by default the mirror the runner names); without one the tests skip."""

import os
import re
import subprocess
import sys

import pytest

from etcd_server import EtcdMissing, etcd_binary

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream", "run_mooncake_suite.py")
DEFAULT_SRC = "/work/.mirror/kvcache-ai+Mooncake/repo"
# The runner's own bounds cover the suite (its SUITE_TIMEOUT_S per run); this covers the runner.
RUNNER_TIMEOUT_S = 1500
# What the suite holds (Mooncake's initiator test at the mirrored revision); a source with
# more or fewer tests still has to pass all of them.
SUMMARY = re.compile(r"^Mooncake's wheel tests on (.+): (\d+) passed of (\d+)$", re.M)


def source_or_skip():
    src = os.environ.get("HMC_MOONCAKE_SRC") or (DEFAULT_SRC if os.path.isdir(DEFAULT_SRC) else "")
    if not src:
        pytest.skip(f"no Mooncake source: set HMC_MOONCAKE_SRC to a Mooncake checkout or bare git directory "
                    f"({DEFAULT_SRC} is not there)")
    try:
        etcd_binary()
    except EtcdMissing as e:
        pytest.skip(str(e))


def run(*args):
    out = subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    found = SUMMARY.findall(out.stdout)
    assert out.returncode == 0 and found, f"{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
    (on, passed, total), = found
    assert passed == total and int(total) > 0
    return on, out.stdout


def test_mooncakes_wheel_tests_pass_on_hmc_mooncake():
    source_or_skip()
    on, stdout = run()
    assert on == "hmc.mooncake"
    # Only the import line was rewritten: the diff has one line out and one in per file.
    removed = [line for line in stdout.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in stdout.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert removed == ["-from mooncake.engine import TransferEngine"] * 2
    assert added == ["+from hmc.mooncake import TransferEngine"] * 2
    assert "== etcd: " in stdout and "== http: " in stdout


def test_mooncakes_wheel_tests_pass_unmodified_through_the_alias():
    """The files as published, ``import mooncake.engine`` resolved by HMC_ALIAS=mooncake."""
    source_or_skip()
    on, stdout = run("--alias", "--metadata", "etcd")
    assert on == "hmc.mooncake (HMC_ALIAS)"
    assert not [line for line in stdout.splitlines() if line.startswith(("-from", "+from"))]


@pytest.mark.skipif(not os.environ.get("HMC_MOONCAKE_PYTHON"), reason="HMC_MOONCAKE_PYTHON (Mooncake 0.3.13) not given")
def test_mooncakes_wheel_tests_pass_on_mooncake_itself():
    source_or_skip()
    on, _ = run("--real")
    assert on == "Mooncake"


@pytest.mark.skipif(not os.environ.get("HMC_MOONCAKE_PYTHON"), reason="HMC_MOONCAKE_PYTHON (Mooncake 0.3.13) not given")
def test_hmc_mooncake_through_mooncakes_own_http_metadata_server():
    """hmc.mooncake's HTTP client against Mooncake's server (mooncake.http_metadata_server)."""
    source_or_skip()
    on, _ = run("--metadata", "http", "--http-server", "mooncake")
    assert on == "hmc.mooncake"
