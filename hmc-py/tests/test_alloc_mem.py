"""``Engine.alloc_mem``: host memory the engine owns, registered as it is allocated, that
peers WRITE into and READ from; under ``shm`` and ``auto`` it is shared memory (a memfd
mapping, which a peer on this host copies with ``memcpy``), under ``tcp`` heap memory; it
is freed by ``deregister_mem``, which refuses while a view of it is open."""

import numpy as np
import pytest

import hmc
from conftest import new_engine
from peers import pattern


def in_memfd(addr):
    """Whether ``addr`` lies in a memfd mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return "/memfd:" in line
    return False


@pytest.mark.parametrize("transport", ["tcp", "shm", "auto"])
def test_peers_write_and_read_engine_allocated_memory(transport):
    n = 1 << 20
    a, b = new_engine(transport=transport), new_engine(transport=transport)
    try:
        m = b.alloc_mem(n)
        assert (len(m), m.handle.length, m.handle.addr) == (n, n, m.addr)
        assert not m.handle.readonly
        view = np.frombuffer(m, dtype=np.uint8)
        assert view.size == n and not view.any(), "allocated memory starts zeroed"
        assert in_memfd(m.addr) == (transport != "tcp")
        src = np.frombuffer(pattern(n, 5).tobytes(), dtype=np.uint8).copy()
        dst = np.zeros(n, dtype=np.uint8)
        hs, hd = a.register_mem(src), a.register_mem(dst)
        a.connect(b.local_address)
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, m.addr, n)], timeout_ms=10_000)
        assert np.array_equal(view, src), "the peer's WRITE is in the allocated memory"
        view[: n // 2] = 7
        a.transfer_sync(b.local_address, hmc.TransferOp.READ, [(hd.addr, m.addr, n)], timeout_ms=10_000)
        assert np.array_equal(dst, view)
        a.deregister_mem(hs)
        a.deregister_mem(hd)
        del view
        b.deregister_mem(m.handle)
    finally:
        a.finalize()
        b.finalize()


def test_deregistration_waits_for_views_to_close_and_then_frees():
    e = new_engine(transport="shm")
    try:
        m = e.alloc_mem(4096)
        view = memoryview(m)
        with pytest.raises(BufferError, match="still open"):
            e.deregister_mem(m.handle)
        view[0] = 1  # still there
        view.release()
        e.deregister_mem(m.handle)
        assert not in_memfd(m.addr), "the shared memory is unmapped once deregistered"
        with pytest.raises(BufferError, match="freed"):
            memoryview(m)
        with pytest.raises(hmc.InvalidArgumentError):
            e.alloc_mem(0)
    finally:
        e.finalize()


def test_a_view_open_at_finalize_keeps_the_memory():
    e = new_engine(transport="shm")
    m = e.alloc_mem(1 << 16)
    view = np.frombuffer(m, dtype=np.uint8)
    e.finalize()
    view[:] = 3  # the memory is the engine's until the last object over it goes
    assert int(view.sum()) == 3 << 16
    del view, m
