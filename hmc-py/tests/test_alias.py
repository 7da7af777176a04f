"""The opt-in aliases: with ``HMC_ALIAS`` set, unmodified NIXL and Mooncake code (``import
nixl``, ``from mooncake.engine import TransferEngine``) runs on hmc, in child processes too;
without it nothing changes; a real package installed under the name is not hidden unless
overridden."""

import json
import os
import subprocess
import sys

import pytest

from test_mooncake import EXPECTED as MOONCAKE_EXPECTED
from test_mooncake import run_pattern as run_mooncake
from test_nixl import EXPECTED as NIXL_EXPECTED
from test_nixl import LOOPBACK, PARTIAL_MD, run_pattern

HERE = os.path.dirname(os.path.abspath(__file__))


def py(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HMC_ALIAS")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=60)


def test_off_unless_asked():
    r = py("import nixl")
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


def test_nixl_code_runs_unchanged_through_the_alias():
    r = py("import nixl, nixl._bindings as b; from nixl._api import nixl_agent; "
           "print(nixl.__name__, nixl_agent.__module__, b.__name__)", HMC_ALIAS="nixl")
    assert r.stdout.split() == ["hmc.nixl", "hmc.nixl._api", "hmc.nixl._bindings"], r.stderr
    assert "resolves to hmc's work-alike" in r.stderr  # said once, on stderr
    # The vLLM-pattern script with the package name `nixl`, unmodified: both of its
    # processes (the prefill is a child) run on hmc.
    out = subprocess.run([sys.executable, os.path.join(HERE, "nixl_vllm_pattern.py"), "nixl"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HMC_ALIAS="nixl"))
    got = {ln.split(" ", 2)[1]: json.loads(ln.split(" ", 2)[2]) for ln in out.stdout.splitlines() if ln.startswith("RESULT ")}
    assert got == NIXL_EXPECTED, out.stderr[-2000:]


@pytest.mark.parametrize("script, expected", [("nixl_loopback.py", LOOPBACK), ("nixl_partial_md.py", PARTIAL_MD)])
def test_nixl_flows_run_unchanged_through_the_alias(script, expected, monkeypatch):
    monkeypatch.setenv("HMC_ALIAS", "nixl")
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    assert run_pattern(sys.executable, "nixl", os.path.join(HERE, script)) == expected


def test_mooncake_code_runs_unchanged_through_the_alias(monkeypatch):
    monkeypatch.setenv("HMC_ALIAS", "mooncake")
    assert run_mooncake(sys.executable, "mooncake.engine") == MOONCAKE_EXPECTED


def test_a_real_package_is_not_hidden_unless_overridden(tmp_path):
    (tmp_path / "nixl").mkdir()
    (tmp_path / "nixl" / "__init__.py").write_text("REAL = True\n")
    code = "import nixl; print(getattr(nixl, 'REAL', False), nixl.__name__)"
    r = py(code, HMC_ALIAS="nixl", PYTHONPATH=str(tmp_path))
    assert r.stdout.split() == ["True", "nixl"] and "override" in r.stderr, r.stderr
    r = py(code, HMC_ALIAS="nixl", HMC_ALIAS_OVERRIDE="1", PYTHONPATH=str(tmp_path))
    assert r.stdout.split() == ["False", "hmc.nixl"], r.stderr
