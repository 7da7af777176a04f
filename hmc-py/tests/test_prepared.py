"""Prepared lists and posted transfers in vLLM's pattern, between this process and a
peer process: numpy entry and index arrays, strided entries, notifications delivered
after the bytes, failure notices, the no-progress timeout with no late bytes, release,
telemetry, metadata blobs. Checked by digests on both sides."""

import socket
import time

import numpy as np
import pytest

import hmc
from conftest import new_engine
from peers import digest, kv_layers_peer, layer_pattern

LAYERS, BLOCKS, BLOCK = 4, 64, 4096


def start(peer_factory, transport="tcp", layers=LAYERS, blocks=BLOCKS, block=BLOCK, port=0, **opts):
    p = peer_factory(kv_layers_peer, layers, blocks, block, {"transport": transport}, port)
    name, blob, addrs = p.recv()
    return p, name, blob, addrs


def block_table(addrs, blocks, block):
    """vLLM's per-(layer, block) descriptors as an N x 3 array (addr, len, dev)."""
    base = np.repeat(np.array(addrs, dtype=np.int64), blocks)
    offs = np.tile(np.arange(blocks, dtype=np.int64) * block, len(addrs))
    return np.stack([base + offs, np.full_like(base, block), np.zeros_like(base)], axis=1)


def local_cache(e, layers=LAYERS, blocks=BLOCKS, block=BLOCK):
    regions = [np.zeros(blocks * block, dtype=np.uint8) for _ in range(layers)]
    for r in regions:
        e.register_mem(r)
    return regions


def blk(regions, entry, blocks=BLOCKS, block=BLOCK):
    layer, b = divmod(entry, blocks)
    return regions[layer][b * block:(b + 1) * block]


@pytest.mark.parametrize("transport", ["tcp", "shm", "auto"])
def test_vllm_style_read_then_write_with_notification(peer_factory, transport):
    p, name, blob, addrs = start(peer_factory, transport)
    e = new_engine(transport=transport)
    regions = local_cache(e)
    assert e.add_remote(blob) == name and e.check_remote(name)
    local = e.prepare_local(block_table([r.ctypes.data for r in regions], BLOCKS, BLOCK))
    remote = e.prepare_remote(name, block_table(addrs, BLOCKS, BLOCK))
    assert (len(local), len(remote)) == (LAYERS * BLOCKS, LAYERS * BLOCKS)
    assert local.segments == LAYERS

    rng = np.random.default_rng(5)
    theirs = rng.choice(LAYERS * BLOCKS, 64, replace=False)
    ours = rng.choice(LAYERS * BLOCKS, 64, replace=False)
    x = e.make_transfer(hmc.TransferOp.READ, local, ours, remote, theirs.tolist())
    for _ in range(2):  # re-posted once ended
        x.post()
        assert x.wait() == hmc.TransferStatus.COMPLETED and x.done()
    sums = p.send("sums") or p.recv()
    for o, t in zip(ours, theirs):
        assert digest(blk(regions, int(o))) == sums[int(t)]
    t = x.telemetry()
    assert t["ok"] and t["bytes"] == 64 * BLOCK and t["requested_descs"] == 64
    assert 1 <= t["descs"] <= 64 and t["duration_us"] > 0 and t["posted_at"] > 0
    assert t["transport"]

    for r in regions:
        r[:] = np.arange(r.size, dtype=np.uint8) * 3
    src, dst = rng.choice(LAYERS * BLOCKS, 32, replace=False), rng.choice(LAYERS * BLOCKS, 32, replace=False)
    msg = ",".join(f"{d // BLOCKS}:{d % BLOCKS}:{digest(blk(regions, int(s)))}" for s, d in zip(src, dst))
    w = e.make_transfer(hmc.TransferOp.WRITE, local, src, remote, dst, notif_msg=msg.encode(), notif_name="done")
    w.post()
    p.send("verify")
    assert w.wait() == hmc.TransferStatus.COMPLETED
    assert p.recv() == ("done", True, None)
    e.finalize()


def test_strided_entries_and_merges(peer_factory):
    p, name, blob, addrs = start(peer_factory)
    e = new_engine()
    regions = local_cache(e)
    e.add_remote(blob)
    strided = lambda base: (base, BLOCK, 0, BLOCK, BLOCKS)  # noqa: E731
    local = e.prepare_local(np.array([strided(r.ctypes.data) for r in regions], dtype=np.uint64))
    remote = e.prepare_remote(name, [strided(a) for a in addrs])
    assert len(remote) == LAYERS * BLOCKS and remote.segments == LAYERS and remote.heap_bytes < 1024
    seq = np.arange(8, 40)
    assert e.make_transfer(hmc.TransferOp.READ, local, seq, remote, seq).runs == 1
    x = e.make_transfer(hmc.TransferOp.READ, local, seq, remote, seq[::-1].copy())
    assert x.runs == 32
    x.post()
    assert x.wait() == hmc.TransferStatus.COMPLETED
    want = layer_pattern(0, BLOCKS * BLOCK, 1)
    for o, t in zip(seq, seq[::-1]):
        assert bytes(blk(regions, int(o))) == bytes(want[t * BLOCK:(t + 1) * BLOCK])
    with pytest.raises(hmc.InvalidArgumentError, match="outside the local list"):
        e.make_transfer(hmc.TransferOp.READ, local, [LAYERS * BLOCKS], remote, [0])
    with pytest.raises(hmc.InvalidArgumentError, match="2, 3 or 5 fields"):
        e.prepare_local(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(hmc.NotRegisteredError):
        e.prepare_remote(name, [(addrs[0] + BLOCKS * BLOCK, 8)])
    e.finalize()


def test_a_stopped_target_ends_the_post_and_gets_no_late_bytes(peer_factory):
    p, name, blob, addrs = start(peer_factory, layers=1, blocks=128, block=65536)
    e = new_engine(no_progress_timeout_ms="1000")
    regions = local_cache(e, 1, 128, 65536)
    regions[0][:] = 0xEE
    e.add_remote(blob)
    before = p.send("sums") or p.recv()
    local = e.prepare_local([(regions[0].ctypes.data, 65536, 0, 65536, 128)])
    remote = e.prepare_remote(name, [(addrs[0], 65536, 0, 65536, 128)])
    idx = np.arange(128)
    w = e.make_transfer(hmc.TransferOp.WRITE, local, idx, remote, idx, notif_msg=b"w")
    p.stop()
    t0 = time.monotonic()
    w.post()
    assert w.wait() == hmc.TransferStatus.TIMEOUT  # ends, never "in progress" forever
    assert 0.9 <= time.monotonic() - t0 < 5
    assert isinstance(w.error(), hmc.TimeoutError)
    p.cont()
    time.sleep(0.5)
    assert (p.send("sums") or p.recv()) == before, "bytes of the abandoned WRITE landed"
    # The failure notice reaches the target once it runs again.
    deadline = time.monotonic() + 10
    while True:
        got = p.send("notifs") or p.recv()
        if got:
            assert got[0][1:3] == ("", b"w") and got[0][3]
            break
        assert time.monotonic() < deadline, "no failure notice"
        time.sleep(0.05)
    e.finalize()


def test_release_cancels_and_refuses_later_posts(peer_factory):
    p, name, blob, addrs = start(peer_factory, layers=1, blocks=512, block=65536)
    e = new_engine()
    regions = local_cache(e, 1, 512, 65536)
    e.add_remote(blob)
    local = e.prepare_local([(regions[0].ctypes.data, 65536, 0, 65536, 512)])
    remote = e.prepare_remote(name, [(addrs[0], 65536, 0, 65536, 512)])
    x = e.make_transfer(hmc.TransferOp.READ, local, np.arange(512)[::-1].copy(), remote, np.arange(512))
    x.post()
    x.release()
    assert x.done()
    regions[0][:] = 0x5A
    time.sleep(0.3)
    assert (regions[0] == 0x5A).all()
    with pytest.raises(hmc.InvalidArgumentError, match="released"):
        x.post()
    e.finalize()


def test_a_list_under_a_deregistered_region_is_invalid(peer_factory):
    p, name, blob, addrs = start(peer_factory)
    e = new_engine()
    regions = local_cache(e)
    e.add_remote(blob)
    local = e.prepare_local(block_table([r.ctypes.data for r in regions], BLOCKS, BLOCK))
    remote = e.prepare_remote(name, block_table(addrs, BLOCKS, BLOCK))
    x = e.make_transfer(hmc.TransferOp.WRITE, local, [64, 65], remote, [64, 65], notif_msg=b"m", notif_name="l1")
    p.send(("dereg", 1))
    assert p.recv() == "ok"
    x.post()
    assert x.wait() == hmc.TransferStatus.FAILED
    assert isinstance(x.error(), hmc.NotRegisteredError) and hex(addrs[1]) in str(x.error())
    e.finalize()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_blob_of_a_restarted_peer_is_refused(peer_factory):
    port = free_port()
    p, name, old_blob, _ = start(peer_factory, layers=1, blocks=4, port=port)
    p.send("stop")
    assert p.recv() == "bye"
    p.close()
    p2, name2, new_blob, _ = start(peer_factory, layers=1, blocks=4, port=port)
    assert name2 == name
    e = new_engine()
    with pytest.raises(hmc.UnavailableError, match="stale"):
        e.add_remote(old_blob)
    assert not e.check_remote(name)
    assert e.add_remote(new_blob) == name
    e.remove_remote(name)
    assert not e.check_remote(name)
    e.finalize()


def test_a_long_context_request_of_1_3_million_descriptors(peer_factory):
    n, block = 1_300_000, 16
    p, name, blob, addrs = start(peer_factory, layers=1, blocks=n, block=block)
    e = new_engine()
    (region,) = local_cache(e, 1, n, block)
    e.add_remote(blob)
    table = np.stack([region.ctypes.data + np.arange(n, dtype=np.int64) * block,
                      np.full(n, block, dtype=np.int64), np.zeros(n, dtype=np.int64)], axis=1)
    local = e.prepare_local(table)
    del table
    remote = e.prepare_remote(name, [(addrs[0], block, 0, block, n)])
    assert local.segments == 1 and remote.segments == 1
    perm = np.random.default_rng(3).permutation(n)
    x = e.make_transfer(hmc.TransferOp.READ, local, np.arange(n), remote, perm)
    x.post()
    assert x.wait() == hmc.TransferStatus.COMPLETED
    want = layer_pattern(0, n * block, 1).reshape(n, block)
    assert (region.reshape(n, block) == want[perm]).all()
    assert x.telemetry()["requested_descs"] == n
    e.finalize()


def test_folded_array_entries_cross_registrations_and_index_as_given(pair):
    """An N x 3 array's contiguous rows are read as strided runs (one entry for a million
    blocks); a run that crosses from one registration into the next (two registrations
    side by side in one buffer) is prepared row by row instead, and every index still
    names the row the caller wrote."""
    a, b = pair
    block, blocks = 256, 64
    src = np.arange(blocks * block, dtype=np.uint32).view(np.uint8)[: blocks * block].copy()
    dst = np.zeros_like(src)
    half = blocks * block // 2
    # Two registrations of one buffer, back to back: contiguous blocks run across them.
    b.register_mem(src[:half])
    b.register_mem(src[half:])
    a.register_mem(dst)
    peer = a.add_remote(b.local_metadata())
    rows = block_table([src.ctypes.data], blocks, block)
    ours = block_table([dst.ctypes.data], blocks, block)
    remote = a.prepare_remote(peer, rows)
    local = a.prepare_local(ours)
    assert len(remote) == len(local) == blocks
    idx = np.array([0, blocks // 2 - 1, blocks // 2, blocks - 1, 7], dtype=np.int64)
    x = a.make_transfer(hmc.TransferOp.READ, local, idx, remote, idx)
    x.post()
    assert x.wait(5000) == hmc.TransferStatus.COMPLETED
    for i in idx:
        s = slice(int(i) * block, (int(i) + 1) * block)
        assert (dst[s] == src[s]).all(), i
    assert dst[block : 2 * block].sum() == 0  # block 1 was not asked for
    # A row outside every registration is refused as the row it is.
    bad = rows.copy()
    bad[3, 0] = 16
    with pytest.raises(hmc.NotRegisteredError, match="0x10"):
        a.prepare_remote(peer, bad)
