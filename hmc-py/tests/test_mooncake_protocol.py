"""``hmc.mooncake``'s protocol argument as Mooncake reads it: ``rdma`` on a host without an
RDMA device runs on TCP (said once in the log), and ``MC_FORCE_TCP`` makes it TCP whatever
the protocol. SGLang's ``--disaggregation-transfer-backend mooncake_tcp`` sets
``MC_FORCE_TCP=1`` and passes ``"rdma"``."""

import logging
import socket

import numpy as np
import pytest

import hmc
import hmc.mooncake as mc
from hmc.mooncake import TransferEngine

FALLBACK = "no RDMA device here"
FORCED = "MC_FORCE_TCP is set"


def rdma_device_present() -> bool:
    e = hmc.Engine()
    try:
        e.initialize("127.0.0.1:0", {"transport": "rdma"})
    except hmc.UnavailableError:
        return False
    e.finalize()
    return True


@pytest.fixture
def fresh_log(monkeypatch, caplog):
    """What hmc.mooncake says once per process, said again for this test; its records."""
    monkeypatch.setattr(mc, "_said", set())
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    monkeypatch.delenv("HMC_CONFIG", raising=False)
    caplog.set_level(logging.WARNING, logger="hmc.mooncake")
    return caplog


def transfer_between(a, b):
    """A READ from b to a over the engines' sessions: True when the bytes arrived."""
    src = np.random.default_rng(9).integers(0, 256, 1 << 16, dtype=np.uint8)
    dst = np.zeros(1 << 16, np.uint8)
    assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert b.register_memory(src.ctypes.data, src.nbytes) == 0
    target = f"127.0.0.1:{b.get_rpc_port()}"
    return a.transfer_sync_read(target, dst.ctypes.data, src.ctypes.data, src.nbytes) == 0 and (dst == src).all()


def said(caplog, text):
    return sum(text in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(rdma_device_present(), reason="this host has an RDMA device: rdma does not fall back")
def test_rdma_without_a_device_falls_back_to_tcp_and_says_so_once(fresh_log):
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    assert a._engine().capabilities()["transport"] == "Tcp"
    assert transfer_between(a, b)
    assert said(fresh_log, FALLBACK) == 1  # once, for both engines
    assert "TCP transport" in fresh_log.text


@pytest.mark.skipif(rdma_device_present(), reason="this host has an RDMA device: rdma does not fall back")
def test_a_configured_rdma_transport_does_not_fall_back(fresh_log, tmp_path, monkeypatch):
    """HMC_CONFIG's transport is hmc's own explicit choice: it fails rather than fall back."""
    cfg = tmp_path / "hmc.toml"
    cfg.write_text('[mooncake]\ntransport = "rdma"\n')
    monkeypatch.setenv("HMC_CONFIG", str(cfg))
    assert TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert said(fresh_log, FALLBACK) == 0


@pytest.mark.parametrize("value", ["1", "true", "0"])
def test_mc_force_tcp_makes_rdma_tcp(fresh_log, monkeypatch, value):
    """SGLang's mooncake_tcp (MC_FORCE_TCP=1, "rdma", P2PHANDSHAKE). Set to any value
    (Mooncake tests getenv, not the value): tcp, said once, no RDMA tried."""
    monkeypatch.setenv("MC_FORCE_TCP", value)
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    assert a._engine().capabilities()["transport"] == "Tcp"
    assert transfer_between(a, b)
    assert said(fresh_log, FORCED) == 1
    assert said(fresh_log, FALLBACK) == 0



def test_send_probe_reaches_the_peer_now():
    """SGLang's failed-session probe (SGLANG_ENABLE_FAILED_SESSION_PROBE) lifts a decode
    session's blacklist when ``send_probe`` returns 0. Mooncake 0.3.13 probes the peer each
    time: 0 while it answers, ERR_SOCKET (-102) once it is gone, also for a session it was
    connected to; hmc.mooncake answered 0 for any session it had connected once."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    session = f"127.0.0.1:{b.get_rpc_port()}"
    assert transfer_between(a, b)
    assert a.send_probe(session) == 0
    b._engine().finalize()  # the decode went away
    assert a.send_probe(session) == -102
    assert a.send_probe(session) == -102
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    assert a.send_probe(f"127.0.0.1:{unused}") == -102
