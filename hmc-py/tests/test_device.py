"""Device memory peers can reach, from Python: a CUDA region registered in one process
(through ``__cuda_array_interface__`` and as ``(addr, length)`` with ``device=``) is READ
and WRITTEN by an engine in another process over ``tcp`` and ``ucx``, and a prefill process's KV cache
in device memory is pulled by a decoder, checksums on both sides.

The device is the project's CUDA driver ABI shim (``hmc-backend-cuda/tests/shim``),
compiled here and loaded as ``libcuda.so`` by cudarc's real loader in a child process
(``LD_LIBRARY_PATH``). Its device memory is host memory, so the child fills and checks it
with ``ctypes``; the engine only ever reaches it through the CUDA backend's copies. This
checks the Python path and the staged TCP and UCX paths, not a GPU."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

import hmc
from conftest import new_engine
from hmc import kv

ROOT = Path(__file__).resolve().parents[2]
N = 3 << 20  # three 1 MiB staging chunks, so the pipelined path runs

SHIM_DEVICE = """
    import ctypes, json, sys, zlib
    import hmc

    cu = ctypes.CDLL("libcuda.so")
    assert cu.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0

    def alloc(n):
        p = ctypes.c_ulonglong()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value
    """

CHILD = textwrap.dedent(
    SHIM_DEVICE
    + """
    n, transport = int(sys.argv[1]), sys.argv[2]
    src, dst = alloc(n), alloc(n)
    pattern = bytes((i * 7 + 3) % 251 for i in range(n))
    ctypes.memmove(src, pattern, n)
    ctypes.memset(dst, 0, n)

    class CudaArray:
        # What Numba, CuPy and PyTorch export (version 3, the legacy default stream).
        def __init__(self, ptr, n):
            self.__cuda_array_interface__ = {
                "shape": (n,), "typestr": "|u1", "data": (ptr, False),
                "strides": None, "version": 3, "stream": 1,
            }

    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {"transport": transport})
    hs = e.register_mem(CudaArray(src, n))
    hd = e.register_mem((dst, n), hmc.MemType.DEVICE, device="cuda:0")
    caps = e.capabilities()
    print(json.dumps({"addr": e.local_address, "src": hs.addr, "dst": hd.addr,
                      "path": caps["device_paths"]["cuda"], "crc": zlib.crc32(pattern)}),
          flush=True)
    sys.stdin.readline()  # the peer has written dst
    print(json.dumps({"crc": zlib.crc32(ctypes.string_at(dst, n))}), flush=True)
    sys.stdin.readline()
    e.finalize()
    """
)

# A prefill process: a paged KV cache (2 tensors of 8 blocks of 512 B) in device memory,
# published under BlocksCacheKey(1), blocks filled with a pattern.
PREFILL = textwrap.dedent(
    SHIM_DEVICE
    + """
    from hmc import kv

    blocks, block = 8, 512
    desc = kv.CacheDesc(2, kv.DataType.F16, [blocks, block // 2],
                        placement=hmc.MemType.DEVICE, device="cuda:0")
    tensors = [alloc(blocks * block) for _ in range(2)]
    for t, ptr in enumerate(tensors):
        ctypes.memmove(ptr, bytes((i * 5 + t * 17) % 241 for i in range(blocks * block)), blocks * block)
    dd = kv.DataDist(1, kv.Role.PROMPT)
    dd.initialize("127.0.0.1:0", {"transport": "tcp"})
    cache = dd.register_kv_cache(desc, [(p, blocks * block) for p in tensors],
                                 blocks_key=kv.BlocksCacheKey(1))
    print(json.dumps({"addr": dd.local_address}), flush=True)
    ids = json.loads(sys.stdin.readline())
    print(json.dumps([zlib.crc32(b"".join(ctypes.string_at(p + b * block, block) for b in ids))
                      for p in tensors]), flush=True)
    sys.stdin.readline()
    dd.deallocate_cache(cache)
    dd.finalize()
    """
)


@pytest.fixture(scope="module")
def cuda_shim(tmp_path_factory):
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.fail(f"no C compiler ({cc}) to build the CUDA driver shim; install gcc")
    out = tmp_path_factory.mktemp("cuda-shim")
    lib = out / "libcuda.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-pthread", f"-I{ROOT / 'hmc-testshim/shim'}",
         str(ROOT / "hmc-backend-cuda/tests/shim/cuda_shim.c"), "-o", str(lib)],
        check=True,
    )
    # cudarc tries libcuda.so, then libcuda.so.1: both are the shim, so no system driver
    # is ever picked up.
    shutil.copy(lib, out / "libcuda.so.1")
    return out


def shim_child(cuda_shim, script, *args):
    env = {**os.environ, "LD_LIBRARY_PATH": str(cuda_shim)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )


# Over ucx the UCX here has no CUDA support: the device regions are staged over its
# control connection, as TCP stages them.
@pytest.mark.parametrize("transport", ["tcp", "ucx"])
def test_a_peer_reads_and_writes_cuda_memory_registered_from_python(cuda_shim, transport):
    child = shim_child(cuda_shim, CHILD, N, transport)
    try:
        info = json.loads(child.stdout.readline())
        assert info["path"] == "staged"
        host_in, host_out = bytearray(N), bytearray(bytes((i * 13 + 1) % 253 for i in range(N)))
        with new_engine(transport=transport) as e:
            hi, ho = e.register_mem(host_in), e.register_mem(host_out)
            e.connect(info["addr"], 5000)
            e.transfer_sync(info["addr"], hmc.TransferOp.READ, [(hi.addr, info["src"], N)])
            assert zlib.crc32(host_in) == info["crc"], "the peer's READ of device memory differs"
            # A prepared READ of it says the bytes went through the peer's staging chunks.
            host_in[:] = bytes(N)
            local = e.prepare_local([(hi.addr, N, 0)])
            remote = e.prepare_remote(info["addr"], [(info["src"], N, 0)], 5000)
            x = e.make_transfer(hmc.TransferOp.READ, local, [0], remote, [0])
            x.post()
            assert x.wait(10_000) == hmc.TransferStatus.COMPLETED, x.error()
            t = x.telemetry()
            assert (t["bytes"], t["staged_at_peer_bytes"]) == (N, N), t
            assert zlib.crc32(host_in) == info["crc"]
            x.release()
            e.transfer_sync(info["addr"], hmc.TransferOp.WRITE, [(ho.addr, info["dst"], N)])
            child.stdin.write("written\n")
            child.stdin.flush()
            got = json.loads(child.stdout.readline())
            assert got["crc"] == zlib.crc32(host_out), "the peer's WRITE into device memory differs"
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()


def test_a_decoder_pulls_kv_blocks_from_a_prefill_cache_in_device_memory(cuda_shim):
    child = shim_child(cuda_shim, PREFILL)
    try:
        addr = json.loads(child.stdout.readline())["addr"]
        src_blocks, dst_blocks = [1, 2, 6], [0, 1, 2]
        with kv.DataDist(2, kv.Role.DECODER) as dd:
            dd.initialize("127.0.0.1:0", {"transport": "tcp"})
            assert dd.link_clusters([(1, addr)]) == [None]
            cache = dd.allocate_cache(kv.CacheDesc(2, kv.DataType.F16, [8, 256]))
            dd.pull_kv_blocks(kv.BlocksCacheKey(1), cache, src_blocks, dst_blocks, timeout_ms=10_000)
            got = [zlib.crc32(bytes(memoryview(t)[: 3 * 512])) for t in cache.tensors]
            child.stdin.write(json.dumps(src_blocks) + "\n")
            child.stdin.flush()
            assert got == json.loads(child.stdout.readline()), "the pulled blocks differ"
            dd.deallocate_cache(cache)
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()


# NIXL's calls on VRAM (hmc.nixl): a "prefill" agent registers CUDA memory, a "decode"
# agent READs it with initialize_xfer and WRITEs into it through prepared lists.
NIXL_VRAM = textwrap.dedent(
    SHIM_DEVICE
    + """
    import numpy as np
    from hmc.nixl._api import nixl_agent, nixl_agent_config

    n = 1 << 20
    vram = alloc(n)
    ctypes.memmove(vram, bytes((i * 3 + 1) % 255 for i in range(n)), n)
    prefill = nixl_agent("prefill", nixl_agent_config(backends=["tcp"]))
    decode = nixl_agent("decode", nixl_agent_config(backends=["tcp"]))
    prefill.register_memory([(vram, n, 0, "")], "VRAM")
    dst = np.zeros(n, np.uint8)
    src = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    decode.register_memory([(dst.ctypes.data, n, 0, ""), (src.ctypes.data, n, 0, "")], "DRAM")
    name = decode.add_remote_agent(prefill.get_agent_metadata())

    def run(h):
        st = decode.transfer(h)
        while st == "PROC":
            st = decode.check_xfer_state(h)
        decode.release_xfer_handle(h)
        return st

    out = {}
    local = decode.get_xfer_descs([(dst.ctypes.data, n, 0)], "DRAM")
    remote = decode.get_xfer_descs([(vram, n, 0)], "VRAM")
    out["read"] = run(decode.initialize_xfer("READ", local, remote, name))
    out["read_ok"] = dst.tobytes() == ctypes.string_at(vram, n)
    lh = decode.prep_xfer_dlist("NIXL_INIT_AGENT", [(src.ctypes.data, n, 0)], "DRAM")
    rh = decode.prep_xfer_dlist(name, [(vram, n, 0)], "VRAM")
    out["write"] = run(decode.make_prepped_xfer("WRITE", lh, [0], rh, [0]))
    out["write_ok"] = ctypes.string_at(vram, n) == src.tobytes()
    # The prefill's own VRAM in a prepared local list (vLLM's pattern): pushed to the
    # decode's host memory in blocks, then a block pulled back into it.
    peer = prefill.add_remote_agent(decode.get_agent_metadata())
    blk = n // 4
    mine = prefill.prep_xfer_dlist("NIXL_INIT_AGENT", [(vram + i * blk, blk, 0) for i in range(4)], "VRAM")
    theirs = prefill.prep_xfer_dlist(peer, [(dst.ctypes.data + i * blk, blk, 0) for i in range(4)], "DRAM")
    dst[:] = 0
    want = ctypes.string_at(vram, n)

    def prun(h):
        st = prefill.transfer(h)
        while st == "PROC":
            st = prefill.check_xfer_state(h)
        prefill.release_xfer_handle(h)
        return st

    out["push"] = prun(prefill.make_prepped_xfer("WRITE", mine, [3, 2, 1, 0], theirs, [0, 1, 2, 3]))
    out["push_ok"] = all(dst[i * blk:(i + 1) * blk].tobytes() == want[(3 - i) * blk:(4 - i) * blk] for i in range(4))
    dst[:blk] = 77
    out["pull"] = prun(prefill.make_prepped_xfer("READ", mine, [1], theirs, [0]))
    out["pull_ok"] = ctypes.string_at(vram + blk, blk) == bytes([77]) * blk
    print(json.dumps(out), flush=True)
    """
)


def test_hmc_nixl_reads_and_writes_vram(cuda_shim):
    child = shim_child(cuda_shim, NIXL_VRAM)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert (got["read"], got["read_ok"], got["write"], got["write_ok"]) == ("DONE", True, "DONE", True), got
    # This engine's own side of a staged region in prepared lists: through its bounce buffers.
    assert (got["push"], got["push_ok"], got["pull"], got["pull_ok"]) == ("DONE", True, "DONE", True), got


def test_the_staging_limits_are_engine_options():
    e = hmc.Engine()
    with pytest.raises(hmc.InvalidArgumentError, match="at least two staging chunks of 1048576 bytes"):
        e.initialize("127.0.0.1:0", {"transport": "tcp", "max_staging_bytes": str(1 << 20)})
    with new_engine(max_staging_bytes=str(4 << 20), staging_chunk_bytes=str(256 << 10)) as e:
        assert e.capabilities()["device_paths"]["cuda"] == "staged"


def test_cuda_array_interface_is_checked(cuda_shim):
    class Bad:
        def __init__(self, cai):
            self.__cuda_array_interface__ = cai

    base = {"shape": (16,), "typestr": "<f4", "data": (0x1000, False), "version": 3}
    with new_engine() as e:
        with pytest.raises(hmc.InvalidArgumentError, match="not C-contiguous"):
            e.register_mem(Bad({**base, "shape": (4, 4), "strides": (4, 32)}))
        with pytest.raises(hmc.InvalidArgumentError, match="read-only"):
            e.register_mem(Bad({**base, "data": (0x1000, True)}))
        with pytest.raises(hmc.InvalidArgumentError, match="stream. 0 is disallowed"):
            e.register_mem(Bad({**base, "stream": 0}))
        with pytest.raises(hmc.InvalidArgumentError, match="CUDA memory"):
            e.register_mem(Bad(base), hmc.MemType.DEVICE, device="rocm:0")



# A ROCm tensor as a DLPack producer hands it out (DLPack's unversioned capsule, kDLROCM =
# 10), a tcp peer READing it, and how many times the HIP shim was asked to synchronise the
# device meanwhile. Run in a child with HMC_HIP_LIB naming the shim.
HIP_CHILD = """
import ctypes, json, os, sys
import hmc

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

class RocmTensor:
    def __init__(self, hip, n):
        self.ptr = ctypes.c_void_p()
        assert hip.hipMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(n)) == 0
        self.shape = (ctypes.c_int64 * 1)(n)
        self.managed = DLManagedTensor(DLTensor(self.ptr, DLDevice(10, 0), 1, DLDataType(1, 8, 1), self.shape, None, 0), None, None)

    def __dlpack_device__(self):
        return (10, 0)

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)

hip = ctypes.CDLL(os.environ["HMC_HIP_LIB"])
n = int(sys.argv[1])
t = RocmTensor(hip, n)
src = bytes((i * 7 + 3) % 251 for i in range(n))
assert hip.hipMemcpy(t.ptr, src, ctypes.c_size_t(n), 1) == 0
a, b = hmc.Engine(), hmc.Engine()
for e in (a, b):
    e.initialize("127.0.0.1:0", {"transport": "tcp"})
before = hip.hmc_shim_device_syncs()
b.register_mem(t)
syncs = hip.hmc_shim_device_syncs() - before
dst = bytearray(n)
hd = a.register_mem(dst)
a.connect(b.local_address, 5000)
a.transfer_sync(b.local_address, hmc.TransferOp.READ, [(hd.addr, t.ptr.value, n)])
print(json.dumps({"syncs": syncs, "path": b.capabilities()["device_paths"]["rocm"], "read_ok": bytes(dst) == src}))
"""


@pytest.fixture(scope="module")
def hip_shim(tmp_path_factory):
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.fail(f"no C compiler ({cc}) to build the HIP shim; install gcc")
    lib = tmp_path_factory.mktemp("hip-shim") / "libamdhip64.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-pthread", f"-I{ROOT / 'hmc-testshim/shim'}",
                    str(ROOT / "hmc-backend-rocm/tests/shim/hip_shim.c"), "-o", str(lib)], check=True)
    return lib


def test_a_rocm_dlpack_tensor_is_synchronised_once_and_reached_by_a_peer(hip_shim):
    """DLPack's producer orders its writes before the default stream: registration waits
    for the device (hipDeviceSynchronize) once, so a peer's READ (here over tcp, staged)
    sees them."""
    out = subprocess.run([sys.executable, "-c", HIP_CHILD, str(3 << 20)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HMC_HIP_LIB": str(hip_shim)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"syncs": 1, "path": "staged", "read_ok": True}, got
