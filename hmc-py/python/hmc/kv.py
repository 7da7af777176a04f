"""KV-cache transfer for prefill/decode disaggregation (LLM-DataDist's API in
snake_case): a :class:`DataDist` per cluster with a :class:`Role`, caches described by
:class:`CacheDesc` and found by :class:`CacheKey` (a request's whole cache) or
:class:`BlocksCacheKey` (a paged cache's blocks), pulled or pushed between linked
clusters. Host caches expose their tensors as buffer objects (``Cache.tensors``), so
``numpy.frombuffer(t, dtype)`` views them in place.

Example (decode side)::

    dd = hmc.kv.DataDist(cluster_id=2, role=hmc.kv.Role.DECODER)
    dd.initialize("127.0.0.1:0")
    dd.link_clusters([(1, prompt_address)])
    desc = hmc.kv.CacheDesc(num_tensors=4, dtype=hmc.kv.DataType.F16, shape=[64, 16, 128])
    cache = dd.allocate_cache(desc)
    dd.pull_kv_blocks(hmc.kv.BlocksCacheKey(1), cache, src_blocks=[3, 4], dst_blocks=[0, 1])
"""

from ._hmc import BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheTensor, DataDist, DataType, Role

__all__ = [
    "BlocksCacheKey",
    "Cache",
    "CacheDesc",
    "CacheKey",
    "CacheTensor",
    "DataDist",
    "DataType",
    "Role",
]
