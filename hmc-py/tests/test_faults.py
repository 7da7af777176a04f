"""Fault injection from Python, as an inference stack's own test would use it: the
``faults`` key of the ``HMC_CONFIG`` file reaches the engine of ``hmc.nixl`` (and of
``hmc.mooncake``), whose transfers then fail where the spec says (docs/faults.md)."""

import numpy as np
import pytest

from hmc.mooncake import TransferEngine
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

    def use(spec, module="nixl"):
        cfg = tmp_path / "hmc.toml"
        cfg.write_text(f'transport = "tcp"\n[{module}]\nfaults = "{spec}"\n')
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


def test_a_cut_mooncake_write_lands_its_prefix_and_the_retry_lands_the_rest(faulty_config):
    """``hmc.mooncake`` reads the same key from its own table: a WRITE cut after half its
    bytes (``xfer.cut=0.5@first:1``) returns -1 with exactly the first half landed, and
    the retry writes everything."""
    faulty_config("xfer.cut=0.5@first:1", module="mooncake")
    src, dst = TransferEngine(), TransferEngine()
    for te in (src, dst):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    a = np.random.default_rng(5).integers(1, 256, 8192, dtype=np.uint8)
    b = np.zeros_like(a)
    assert src.register_memory(a.ctypes.data, a.nbytes) == 0
    assert dst.register_memory(b.ctypes.data, b.nbytes) == 0
    peer = f"127.0.0.1:{dst.get_rpc_port()}"
    assert src.transfer_sync_write(peer, a.ctypes.data, b.ctypes.data, a.nbytes) == -1
    assert (b[:4096] == a[:4096]).all() and not b[4096:].any()
    assert src.transfer_sync_write(peer, a.ctypes.data, b.ctypes.data, a.nbytes) == 0
    assert (b == a).all()
