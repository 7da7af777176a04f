"""``hmc.mooncake``: Mooncake Transfer Engine's Python API on hmc. The same two-process
script (``mooncake_pattern.py``) on ``hmc.mooncake``, with checksums, and beside Mooncake
0.3.13 when an interpreter with it is given (``HMC_MOONCAKE_PYTHON``, set by ``cargo xtask
test --long``); the calls hmc.mooncake refuses by name."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hmc.mooncake import TransferEngine

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_pattern.py")

# What the script prints on Mooncake 0.3.13 (and must on hmc.mooncake).
EXPECTED = {
    "initialize": 0, "rpc_port": True, "register": 0,
    "sync_read": 0, "sync_read_bytes": True, "sync_write": 0, "sync_write_bytes": True,
    "batch_read": 0, "batch_read_bytes": True, "batch_write": 0, "batch_write_bytes": True,
    "async_batch_id": True, "async_status": 0, "async_bytes": True,
    "submit_status": 1, "submit_bytes": True,
    "sync_with_notify": 0, "notifies": [["kv", "req-1"]],
    "batch_sync_opcode": 0, "batch_sync_opcode_bytes": True, "batch_notifies": [["kv", "req-2"]],
    "async_opcode": [True, 0], "async_opcode_bytes": True, "async_write": [True, 0], "async_write_bytes": True,
    "initialize_ext": 0, "send_probe": 0, "topology_is_json": True,
    "batch_register": 0, "batch_register_read": 0, "batch_register_bytes": True, "batch_unregister": 0,
    "managed_nonzero": True, "write_bytes": 0, "read_bytes": "hello mooncake", "free_managed": 0,
    "unregistered_peer_range": True, "unknown_session": -1, "async_to_unknown_session": 0,
    "unregister": [0, -3], "end": "ok",
}


def run_pattern(python, module):
    out = subprocess.run([python, SCRIPT, module], capture_output=True, text=True, timeout=120)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            _, key, value = line.split(" ", 2)
            results[key] = json.loads(value)
    assert results.get("end") == "ok", f"{module}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return results


def test_the_calls_run_on_hmc_mooncake():
    assert run_pattern(sys.executable, "hmc.mooncake") == EXPECTED


@pytest.mark.skipif(not os.environ.get("HMC_MOONCAKE_PYTHON"), reason="HMC_MOONCAKE_PYTHON (Mooncake 0.3.13) not given")
def test_mooncake_itself_gives_the_same_results():
    assert run_pattern(os.environ["HMC_MOONCAKE_PYTHON"], "mooncake.engine") == EXPECTED


def test_protocols_and_metadata_servers_not_carried_are_refused_by_name():
    te = TransferEngine()
    with pytest.raises(NotImplementedError, match="nvlink"):
        te.initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", "")
    with pytest.raises(NotImplementedError, match="redis://meta:6379"):
        te.initialize("127.0.0.1", "redis://meta:6379", "tcp", "")


def test_unknown_batch_ids_and_own_first_buffer():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert te.get_batch_transfer_status([12345]) == -1  # Mooncake's crashes (intended)
    assert te.transfer_check_status(12345) == -1
    a, b = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    assert te.batch_register_memory([a.ctypes.data, b.ctypes.data], [4096, 4096]) == 0
    # Mooncake's first buffer: the first registered (its segment's buffers[0]).
    assert te.get_first_buffer_address(f"127.0.0.1:{te.get_rpc_port()}") == a.ctypes.data
    with pytest.raises(NotImplementedError, match="another engine under P2PHANDSHAKE"):
        te.get_first_buffer_address("10.0.0.9:1234")
    assert te.batch_unregister_memory([a.ctypes.data, b.ctypes.data]) == 0
    assert te.batch_unregister_memory([a.ctypes.data]) == -3
    with pytest.raises(NotImplementedError, match="get_engine_ptr"):
        te.get_engine_ptr()


def test_engines_find_each_other_through_etcd(etcd):
    """Mooncake's etcd metadata server: engines registered under their local_hostname,
    transfers addressed by it."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("node-a", f"etcd://{etcd}", "tcp", "") == 0
    assert b.initialize("node-b", f"etcd://{etcd}", "tcp", "") == 0
    src = np.random.default_rng(3).integers(0, 256, 65536, dtype=np.uint8)
    dst = np.zeros(65536, np.uint8)
    assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert b.register_memory(src.ctypes.data, src.nbytes) == 0
    assert a.transfer_sync_read("node-b", dst.ctypes.data, src.ctypes.data, 65536) == 0
    assert (dst == src).all()
    assert a.transfer_sync_read("node-c", dst.ctypes.data, src.ctypes.data, 16) == -1


def test_the_module_has_mooncake_engines_names_and_refuses_what_it_does_not_carry():
    import hmc.mooncake as m

    assert TransferEngine.TransferOpcode.Write == m.Write == 1
    assert not any(getattr(m, f"SUPPORT_{k}") for k in ("CUDA", "HIP", "MUSA", "EFA", "INTRA_NVLINK", "MNNVL"))
    for name in ("CoroRPCInterface", "RpcInterface", "ReceivedData", "ReceivedTensor", "SharedSegment",
                 "InnerTransferEngine", "create_rpc_client", "create_rpc_server"):
        with pytest.raises(NotImplementedError, match=name):
            getattr(m, name)()


def test_a_batch_moves_each_block_and_lists_of_unequal_length_fail():
    """Batches go to the engine as (local, remote, length) triples: every block lands where
    its pair says, and lists of unequal length are -1 (nothing moved), not truncated."""
    src, dst = TransferEngine(), TransferEngine()
    for te in (src, dst):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    a = np.arange(8 * 512, dtype=np.uint32).view(np.uint8)[: 8 * 512].copy()
    b = np.zeros_like(a)
    assert src.register_memory(a.ctypes.data, a.nbytes) == 0
    assert dst.register_memory(b.ctypes.data, b.nbytes) == 0
    peer = f"127.0.0.1:{dst.get_rpc_port()}"
    order = [5, 0, 7, 2]
    bufs = [a.ctypes.data + i * 512 for i in order]
    there = [b.ctypes.data + (7 - i) * 512 for i in order]
    assert src.batch_transfer_sync_write(peer, bufs, there, [512] * 4) == 0
    for i in order:
        assert (b[(7 - i) * 512:(8 - i) * 512] == a[i * 512:(i + 1) * 512]).all(), i
    b[:] = 0
    assert src.batch_transfer_sync_write(peer, bufs, there[:3], [512] * 4) == -1
    assert not b.any()
