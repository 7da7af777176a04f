"""``await req`` in asyncio, and many Python threads on one engine pair at once."""

import asyncio
import threading

import numpy as np
import pytest

import hmc


def test_await_transfers_in_asyncio(pair):
    a, b = pair
    n = 16
    src = np.random.default_rng(5).integers(0, 255, n * 65536, dtype=np.uint8)
    dst = np.zeros_like(src)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)

    async def main():
        reqs = [
            a.transfer_async(
                b.local_address,
                hmc.TransferOp.WRITE,
                [(hs.addr + i * 65536, hd.addr + i * 65536, 65536)],
                timeout_ms=10_000,
            )
            for i in range(n)
        ]
        await asyncio.gather(*reqs)
        assert all(r.status() == hmc.TransferStatus.COMPLETED for r in reqs)
        bad = a.transfer_async(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr + (1 << 40), 8)])
        with pytest.raises(hmc.NotRegisteredError):
            await bad
        # Cancelled asyncio waits leave the transfer alone.
        r = a.transfer_async(b.local_address, hmc.TransferOp.READ, [(hs.addr, hd.addr, 4096)])
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.sleep(1)), 0.001)
        await r

    asyncio.run(main())
    np.testing.assert_array_equal(dst, src)


def test_many_threads_transfer_register_and_deregister_at_once(pair):
    a, b = pair
    threads_n, chunk = 16, 64 * 1024
    src = np.random.default_rng(9).integers(0, 255, threads_n * chunk, dtype=np.uint8)
    dst = np.zeros_like(src)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)
    errors = []
    start = threading.Barrier(threads_n)

    def worker(i):
        try:
            start.wait()
            off = i * chunk
            for j in range(20):
                op = hmc.TransferOp.WRITE if j % 2 == 0 else hmc.TransferOp.READ
                a.transfer_sync(b.local_address, op, [(hs.addr + off, hd.addr + off, chunk)], timeout_ms=30_000)
                scratch = bytearray(4096)
                h = a.register_mem(scratch)
                a.deregister_mem(h)
                if j % 5 == 0:
                    r = a.transfer_async(b.local_address, hmc.TransferOp.WRITE, [(hs.addr + off, hd.addr + off, chunk)], timeout_ms=30_000)
                    assert r.wait() == hmc.TransferStatus.COMPLETED
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    np.testing.assert_array_equal(dst, src)
