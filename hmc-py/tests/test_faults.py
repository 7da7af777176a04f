"""Fault injection from Python, as an inference stack's own test would use it: the
``faults`` key of the ``HMC_CONFIG`` file reaches the engine of ``hmc.nixl`` (and of
``hmc.mooncake``), whose transfers then fail where the spec says (docs/faults.md)."""

import numpy as np
import pytest

from hmc.nixl._api import nixl_agent, nixl_agent_config


def _post(agent, handle):
    """Posts ``handle`` and waits for its end state."""
    st = agent.transfer(handle)
    while st == "PROC":
        st = agent.check_xfer_state(handle)
    return st


@pytest.fixture
def faulty_config(tmp_path, monkeypatch):
    """Points HMC_CONFIG at a file whose ``[nixl]`` table sets ``faults`` to the spec the
    test passes; returns the setter."""

    def use(spec):
        cfg = tmp_path / "hmc.toml"
        cfg.write_text(f'transport = "tcp"\n[nixl]\nfaults = "{spec}"\n')
        monkeypatch.setenv("HMC_CONFIG", str(cfg))

    return use


def test_a_failed_transfer_ends_err_and_the_next_one_is_done(faulty_config):
    """The spec fails the first transfer (``xfer.fail=first:1``): its state is ERR and no
    byte lands; posted again, the same handle is DONE with every byte."""
    faulty_config("seed=7;xfer.fail=first:1")
    a = nixl_agent("faults-a", nixl_agent_config(backends=["UCX"]))
    b = nixl_agent("faults-b", nixl_agent_config(backends=["UCX"]))
    try:
        src = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
        dst = np.zeros(1 << 16, np.uint8)
        a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
        b.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
        name = a.add_remote_agent(b.get_agent_metadata())
        h = a.initialize_xfer("READ", a.get_xfer_descs([(dst.ctypes.data, dst.nbytes, 0)], "DRAM"),
                              b.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)], "DRAM"), name)
        assert _post(a, h) == "ERR"
        assert not dst.any(), "a failed transfer moved nothing"
        assert _post(a, h) == "DONE"
        assert (dst == src).all()
        a.release_xfer_handle(h)
    finally:
        for x in (a, b):
            x._engine.finalize()


def test_a_malformed_spec_is_refused_naming_the_item(faulty_config):
    faulty_config("seed=7;xfer.fail=2")
    with pytest.raises(Exception, match=r"`xfer\.fail=2`.*WHEN"):
        nixl_agent("faults-bad", nixl_agent_config(backends=["UCX"]))
