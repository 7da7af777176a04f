"""Bodies of the peer processes the tests spawn (importable by the ``spawn`` start
method, unlike functions defined in test modules run by pytest's rewriting importer)."""

import hashlib

import numpy as np

import hmc

OPTS = {"transport": "tcp"}


def digest(buf) -> str:
    return hashlib.sha256(memoryview(buf).cast("B")).hexdigest()


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def buffers_peer(conn, n):
    """Registers a numpy array and a bytearray of ``n`` bytes, sends their addresses,
    then answers ``digest`` requests until told to stop."""
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", OPTS)
    arr = np.zeros(n // 8, dtype=np.float64)  # written by the test process
    ba = bytearray(pattern(n, 7).tobytes())  # read by the test process
    ha, hb = e.register_mem(arr), e.register_mem(ba)
    conn.send((e.local_address, ha.addr, hb.addr, digest(ba)))
    while True:
        msg = conn.recv()
        if msg == "digest":
            conn.send((digest(arr), digest(ba)))
        elif msg == "notifies":
            conn.send(e.get_notifies())
        else:
            break
    e.deregister_mem(ha)
    e.deregister_mem(hb)
    e.finalize()
    conn.send("bye")


def prompt_peer(conn, cluster_id, desc_args, blocks):
    """A prompt cluster: a paged KV cache under BlocksCacheKey(cluster_id), its
    ``blocks`` filled with a pattern; sends (address, per-tensor digests of those blocks),
    then answers ``digest`` requests for block lists until told to stop."""
    dd = hmc.kv.DataDist(cluster_id, hmc.kv.Role.PROMPT)
    dd.initialize("127.0.0.1:0", OPTS)
    n, dtype, shape = desc_args
    desc = hmc.kv.CacheDesc(n, getattr(hmc.kv.DataType, dtype), shape)
    cache = dd.allocate_cache(desc, blocks_key=hmc.kv.BlocksCacheKey(cluster_id))
    nblocks = desc.shape[0]
    views = [np.frombuffer(t, dtype=np.uint8).reshape(nblocks, -1) for t in cache.tensors]
    for i, v in enumerate(views):
        for b in blocks:
            v[b] = pattern(v.shape[1], 1000 * i + b)

    def block_digests(ids):
        return [digest(np.ascontiguousarray(v[ids])) for v in views]

    conn.send((dd.local_address, block_digests(blocks)))
    while True:
        msg = conn.recv()
        if isinstance(msg, tuple) and msg[0] == "digest":
            conn.send(block_digests(list(msg[1])))
        else:
            break
    del views, v  # the loop variable is a view too
    dd.deallocate_cache(cache)
    dd.finalize()
    conn.send("bye")


def fixed_address_peer(conn, address, seed):
    """An engine at ``address`` (a fixed port, so that a restart comes back there) with a
    4 KiB bytearray of ``pattern(4096, seed)``; sends its address, waits for ``stop``."""
    e = hmc.Engine()
    e.initialize(address, OPTS)
    ba = bytearray(pattern(4096, seed).tobytes())
    h = e.register_mem(ba)
    conn.send((e.local_address, h.addr))
    conn.recv()
    e.finalize()


def layer_pattern(layer: int, n: int, seed: int) -> np.ndarray:
    return pattern(n, 7919 * seed + layer)


def kv_layers_peer(conn, layers, blocks, block, opts, port=0):
    """A KV cache of ``layers`` numpy regions of ``blocks`` x ``block`` bytes (vLLM's one
    region per layer), filled with :func:`layer_pattern`; sends (name, metadata blob,
    region addresses), then answers: ``sums`` (a digest per block, layer-major),
    ``verify`` (waits for one notification, then checks at once the blocks its message
    lists as ``layer:block:digest`` items), ``notifs``, ``dereg L``, ``stop``."""
    e = hmc.Engine()
    e.initialize(f"127.0.0.1:{port}", {**OPTS, **opts})
    regions = [layer_pattern(i, blocks * block, 1).copy() for i in range(layers)]
    handles = [e.register_mem(r) for r in regions]
    conn.send((e.local_address, e.local_metadata(), [h.addr for h in handles]))

    def block_digest(layer, b):
        return digest(regions[layer][b * block:(b + 1) * block])

    while True:
        msg = conn.recv()
        if msg == "sums":
            conn.send([block_digest(i, b) for i in range(layers) for b in range(blocks)])
        elif msg == "verify":
            while True:
                got = e.get_notifications()
                if got:
                    break
            sender, name, body, failed = got[0]
            ok = all(
                block_digest(int(lay), int(b)) == d
                for lay, b, d in (item.split(":") for item in body.decode().split(",") if item)
            )
            conn.send((name, ok, failed))
        elif msg == "notifs":
            conn.send(e.get_notifications())
        elif isinstance(msg, tuple) and msg[0] == "dereg":
            e.deregister_mem(handles[msg[1]])
            conn.send("ok")
        else:
            break
    e.finalize()
    conn.send("bye")
