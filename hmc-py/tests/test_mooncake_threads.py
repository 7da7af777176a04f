"""``hmc.mooncake`` from many threads at once, as SGLang's Mooncake KV manager calls it (a
pool of threads moving chunks to the same peer): the first use of a peer from several
threads connects it once and every call succeeds; concurrent submits get distinct batch
ids; concurrent registrations leave the published segment complete."""

import logging
import threading

import numpy as np

from hmc.mooncake import TransferEngine

THREADS = 16
ROUNDS = 5
CHUNK = 4096


def run_together(fn, n=THREADS):
    """Runs ``fn(i)`` in ``n`` threads released at once; their results in order."""
    barrier = threading.Barrier(n)
    out = [None] * n

    def body(i):
        barrier.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


def two_engines(seed):
    """(a, b, target, src, dst): engine a, engine b holding ``src`` (registered) at session
    ``target``, and a's registered ``dst`` of the same size, THREADS chunks each."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.random.default_rng(seed).integers(0, 256, THREADS * CHUNK, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert b.register_memory(src.ctypes.data, src.nbytes) == 0
    return a, b, f"127.0.0.1:{b.get_rpc_port()}", src, dst


def test_threads_using_a_new_peer_at_once_all_succeed():
    for round_ in range(ROUNDS):
        a, _b, target, src, dst = two_engines(round_)
        codes = run_together(lambda i: a.transfer_sync_read(
            target, dst.ctypes.data + i * CHUNK, src.ctypes.data + i * CHUNK, CHUNK))
        assert codes == [0] * THREADS
        assert (dst == src).all()
        assert not a._connecting  # no lock left behind


def test_concurrent_submits_get_distinct_batch_ids():
    a, _b, target, src, dst = two_engines(ROUNDS)
    assert a.send_probe(target) == 0
    ids = run_together(lambda i: a.batch_transfer_async_read(
        target, [dst.ctypes.data + i * CHUNK], [src.ctypes.data + i * CHUNK], [CHUNK]))
    assert 0 not in ids and len(set(ids)) == THREADS
    assert a.get_batch_transfer_status(ids) == 0
    assert (dst == src).all()


def test_concurrent_registrations_publish_every_buffer(etcd, caplog):
    """Each registration waits until etcd serves the segment it published: concurrent ones
    publish in turn, none waits on a segment another replaced (a warning after 5 s)."""
    caplog.set_level(logging.WARNING, logger="hmc.mooncake")
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("node-reg-a", etcd, "tcp", "") == 0
    assert b.initialize("node-reg-b", etcd, "tcp", "") == 0
    bufs = [np.zeros(CHUNK, np.uint8) for _ in range(THREADS)]
    assert run_together(lambda i: b.register_memory(bufs[i].ctypes.data, CHUNK)) == [0] * THREADS
    seg = b._segment("node-reg-b")
    assert sorted(x["addr"] for x in seg["buffers"]) == sorted(x.ctypes.data for x in bufs)
    assert a.get_first_buffer_address("node-reg-b") == seg["buffers"][0]["addr"]
    assert "not in etcd" not in caplog.text
