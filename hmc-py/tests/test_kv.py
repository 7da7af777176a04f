"""KV blocks between a prompt process and a decoder (this process), caches as buffer
objects, and the KV errors."""

import numpy as np
import pytest

import hmc
from hmc import kv
from peers import digest, prompt_peer

OPTS = {"transport": "tcp"}
# 4 tensors (2 layers x K, V) of 16 blocks of 8 x 32 F16 elements: 512 B per block
# (the dtype by name: it travels to the prompt process).
DESC = (4, "F16", [16, 8, 32])


def desc():
    return kv.CacheDesc(DESC[0], getattr(kv.DataType, DESC[1]), DESC[2])


def test_kv_blocks_between_a_prompt_and_a_decoder_process(peer_factory):
    prompt_blocks = [2, 3, 4, 9]
    p = peer_factory(prompt_peer, 1, DESC, prompt_blocks)
    address, digests = p.recv()
    with kv.DataDist(2, kv.Role.DECODER) as dd:
        dd.initialize("127.0.0.1:0", OPTS)
        assert dd.link_clusters([(1, address)]) == [None]
        assert dd.links() == [(1, address)]
        cache = dd.allocate_cache(desc())
        # Blocks 2, 3, 4 become one run; 9 its own.
        dst_blocks = [0, 1, 2, 7]
        dd.pull_kv_blocks(kv.BlocksCacheKey(1), cache, prompt_blocks, dst_blocks, timeout_ms=10_000)
        views = [np.frombuffer(t, dtype=np.uint8).reshape(16, -1) for t in cache.tensors]
        assert [digest(np.ascontiguousarray(v[dst_blocks])) for v in views] == digests
        # Layer 1 only (tensors 2 and 3): push two of our blocks into the prompt's 10, 11.
        for v in views:
            v[5] = 0xAB
            v[6] = 0xCD
        dd.push_kv_blocks(cache, 1, kv.BlocksCacheKey(1), [5, 6], [10, 11], layers=(1, 2), timeout_ms=10_000)
        p.send(("digest", [10, 11]))
        got = p.recv()
        mine = [digest(np.ascontiguousarray(v[[5, 6]])) for v in views]
        assert got[2:] == mine[2:], "layer 1 was pushed"
        assert got[:2] != mine[:2], "layer 0 was not"
        # Copy within a local cache.
        dd.copy_kv_blocks(cache, [0], [15])
        assert all(np.array_equal(v[0], v[15]) for v in views)
        # Layout errors name both sides before any byte moves.
        other = dd.allocate_cache(kv.CacheDesc(4, kv.DataType.F32, [16, 8, 32]))
        with pytest.raises(hmc.InvalidArgumentError, match="dtype local F32, remote F16"):
            dd.pull_kv_blocks(kv.BlocksCacheKey(1), other, [0], [0])
        with pytest.raises(hmc.InvalidArgumentError, match="out of range"):
            dd.pull_kv_blocks(kv.BlocksCacheKey(1), cache, [99], [0])
        with pytest.raises(hmc.UnknownKeyError, match="is not published"):
            dd.pull_kv_blocks(kv.BlocksCacheKey(1, model_id=5), cache, [0], [0])
        with pytest.raises(hmc.UnknownKeyError, match="is not published"):
            dd.pull_kv_cache(kv.CacheKey(1, req_id=77), cache)
        with pytest.raises(hmc.NotConnectedError, match="link_clusters first"):
            dd.pull_kv_blocks(kv.BlocksCacheKey(3), cache, [0], [0])
        # A view keeps the cache from being freed under it.
        with pytest.raises(hmc.StateError, match="still open"):
            dd.deallocate_cache(cache)
        del views, v  # the loop variable is a view too
        dd.deallocate_cache(cache)
        dd.deallocate_cache(other)
        with pytest.raises(hmc.StateError, match="already deallocated"):
            dd.deallocate_cache(cache)
        assert dd.unlink_clusters([1]) == [None]
    p.send("stop")
    assert p.recv() == "bye"


def test_whole_caches_in_memory_the_caller_owns():
    prompt = kv.DataDist(1, kv.Role.PROMPT)
    prompt.initialize("127.0.0.1:0", OPTS)
    decoder = kv.DataDist(2, kv.Role.DECODER)
    decoder.initialize("127.0.0.1:0", OPTS)
    desc = kv.CacheDesc(2, kv.DataType.F32, [64, 16])
    k, v = np.random.default_rng(1).random((2, 64, 16), dtype=np.float32)
    key = kv.CacheKey(prompt_cluster_id=1, req_id=42)
    src = prompt.register_kv_cache(desc, [k, v], keys=[key])
    assert src.tensor_addrs == [k.ctypes.data, v.ctypes.data]
    dk, dv = np.zeros((64, 16), np.float32), np.zeros((64, 16), np.float32)
    dst = decoder.register_kv_cache(desc, [dk, dv])
    assert decoder.link_clusters([(1, prompt.local_address)]) == [None]
    decoder.pull_kv_cache(key, dst)
    np.testing.assert_array_equal(dk, k)
    np.testing.assert_array_equal(dv, v)
    with pytest.raises(hmc.InvalidArgumentError, match="smaller than"):
        decoder.register_kv_cache(desc, [np.zeros(4, np.float32), dv])
    with pytest.raises(hmc.InvalidArgumentError, match="read-only"):
        decoder.register_kv_cache(desc, [bytes(4096), bytes(4096)])
    with pytest.raises(hmc.InvalidArgumentError, match="names cluster 1"):
        decoder.register_kv_cache(desc, [dk.copy(), dv.copy()], keys=[key])
    decoder.deallocate_cache(dst)
    prompt.deallocate_cache(src)
    decoder.finalize()
    prompt.finalize()


def test_a_datadist_over_an_engine_of_the_caller():
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", OPTS)
    dd = kv.DataDist(7, kv.Role.PROMPT, engine=e)
    assert dd.local_address == e.local_address
    c = dd.allocate_cache(kv.CacheDesc(1, kv.DataType.U8, [4, 4]))
    assert len(c.tensors[0]) == 16 and bytes(c.tensors[0]) == bytes(16)
    # DLPack: in place, and an open view until the consumer lets go.
    t = c.tensors[0]
    assert t.__dlpack_device__() == (1, 0)
    arr = np.from_dlpack(t)
    assert arr.dtype == np.uint8 and arr.shape == (16,) and arr.ctypes.data == t.addr
    arr[3] = 7
    assert bytes(t)[3] == 7
    with pytest.raises(hmc.StateError, match="still open"):
        dd.deallocate_cache(c)
    del arr
    t.__dlpack__()  # capsules nobody consumes release their view when dropped
    t.__dlpack__(max_version=(1, 0))
    dd.deallocate_cache(c)
    with pytest.raises(BufferError, match="deallocated"):
        memoryview(c.tensors[0])
    dd.finalize()
    e.finalize()
