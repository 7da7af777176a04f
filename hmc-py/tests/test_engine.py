"""The engine in one process and across two: numpy arrays and bytearrays moved in place
with checksums, notifications, read-only buffers, DLPack objects, raw addresses."""

import ctypes

import numpy as np
import pytest

import hmc
from conftest import new_engine
from peers import buffers_peer, digest, fixed_address_peer, pattern


def test_two_processes_write_and_read_numpy_arrays_and_bytearrays(peer_factory):
    n = 1 << 20
    p = peer_factory(buffers_peer, n)
    address, arr_addr, ba_addr, ba_digest = p.recv()
    with hmc.Engine() as e:
        e.initialize("127.0.0.1:0", {"transport": "tcp"})
        src = np.frombuffer(pattern(n, 3).tobytes(), dtype=np.float64).copy()
        dst = bytearray(n)
        hs, hd = e.register_mem(src), e.register_mem(dst)
        assert (hs.length, hd.length) == (n, n)
        e.connect(address)
        # WRITE the numpy array into the peer's numpy array, in two halves.
        half = n // 2
        e.transfer_sync(
            address,
            hmc.TransferOp.WRITE,
            [
                hmc.TransferOpDesc(hs.addr, arr_addr, half),
                hmc.TransferOpDesc(hs.addr + half, arr_addr + half, half),
            ],
            timeout_ms=10_000,
        )
        # READ the peer's bytearray into ours.
        e.transfer_sync(
            address, hmc.TransferOp.READ, [(hd.addr, ba_addr, n)], timeout_ms=10_000
        )
        p.send("digest")
        peer_arr, peer_ba = p.recv()
        assert peer_arr == digest(src), "the peer's array differs from what was written"
        assert digest(dst) == peer_ba == ba_digest
        e.send_notify(address, b"done")
        p.send("notifies")
        assert p.recv() == [(e.local_address, b"done")]
        e.deregister_mem(hs)
        e.deregister_mem(hd)
    p.send("stop")
    assert p.recv() == "bye"


def test_writes_and_reads_in_one_process_with_numpy_views(pair):
    a, b = pair
    src = np.arange(4096, dtype=np.int32)
    dst = np.zeros_like(src)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)
    a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, src.nbytes)])
    np.testing.assert_array_equal(dst, src)
    dst[:] = -1
    a.transfer_sync(b.local_address, hmc.TransferOp.READ, [(hs.addr + 4, hd.addr, 8)])
    assert list(src[1:3]) == [-1, -1]
    # The engine holds the object: dropping our name for it keeps the memory registered.
    addr = hd.addr
    del dst
    a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, addr, 16)])
    b.deregister_mem(hd)


def test_a_read_only_buffer_is_a_write_source_never_a_read_target(pair):
    a, b = pair
    ro = bytes(pattern(4096, 1))
    hro = a.register_mem(ro)
    assert hro.readonly
    dst = bytearray(4096)
    hd = b.register_mem(dst)
    a.connect(b.local_address)
    a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hro.addr, hd.addr, 4096)])
    assert bytes(dst) == ro
    with pytest.raises(hmc.InvalidArgumentError, match="read-only"):
        a.transfer_sync(b.local_address, hmc.TransferOp.READ, [(hro.addr + 8, hd.addr, 16)])
    req = a.transfer_async(b.local_address, hmc.TransferOp.READ, [(hro.addr, hd.addr, 1)])
    assert req.wait() == hmc.TransferStatus.FAILED
    assert isinstance(req.error(), hmc.InvalidArgumentError) and "read-only" in str(req.error())
    assert bytes(dst) == ro


def test_read_only_objects_register_read_only_and_peers_cannot_write_them(pair, tmp_path):
    """bytes, a read-only mmap and a read-only numpy.memmap are exported READ: a peer's
    WRITE is refused before a byte moves (it used to crash the target with SIGSEGV on a
    read-only page, or change an immutable bytes), and READs of them still work."""
    import mmap

    a, b = pair
    f = tmp_path / "ro.bin"
    f.write_bytes(pattern(4096, 5).tobytes())
    with open(f, "rb") as fh:
        ro_map = mmap.mmap(fh.fileno(), 4096, access=mmap.ACCESS_READ)
    memmap = np.memmap(f, dtype=np.uint8, mode="r")
    frozen = bytes(pattern(4096, 6))
    src = bytearray(pattern(4096, 7).tobytes())
    hs = a.register_mem(src)
    a.connect(b.local_address)
    for obj in (frozen, ro_map, memmap):
        before = bytes(obj)
        h = b.register_mem(obj)
        assert h.readonly
        with pytest.raises(hmc.InvalidArgumentError, match="READ"):
            a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, h.addr, 16)])
        assert bytes(obj) == before
        dst = bytearray(16)
        hd = a.register_mem(dst)
        a.transfer_sync(b.local_address, hmc.TransferOp.READ, [(hd.addr, h.addr, 16)])
        assert bytes(dst) == before[:16]
        a.deregister_mem(hd)
        b.deregister_mem(h)
    del memmap
    ro_map.close()


def test_raw_ranges_are_checked_against_the_mappings(pair):
    a, _ = pair
    with pytest.raises(hmc.InvalidArgumentError, match="not mapped"):
        a.register_mem((0, 4096))
    with pytest.raises(hmc.InvalidArgumentError, match="not mapped"):
        a.register_mem((0x7FFF00000000, 4096))
    buf = bytearray(64)
    h = a.register_mem((ctypes.addressof((ctypes.c_char * 64).from_buffer(buf)), 64))
    assert not h.readonly
    a.deregister_mem(h)


class Tensor:
    """A DLPack-only wrapper (no buffer protocol), as a framework tensor looks."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **_kw):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_tensors_register_in_place(pair):
    a, b = pair
    src = np.arange(1000, dtype=np.float32)
    dst = np.zeros(1000, dtype=np.float32)
    hs, hd = a.register_mem(Tensor(src)), b.register_mem(Tensor(dst))
    assert hs.addr == src.ctypes.data and hs.length == src.nbytes
    a.connect(b.local_address)
    a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, src.nbytes)])
    np.testing.assert_array_equal(dst, src)
    a.deregister_mem(hs)
    b.deregister_mem(hd)
    with pytest.raises(hmc.InvalidArgumentError, match="not C-contiguous"):
        a.register_mem(Tensor(np.zeros((8, 8))[:, ::2]))


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint8 * 4),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class ForeignDevice:
    """A DLPack producer claiming memory of ``device_type`` (built with ctypes)."""

    def __init__(self, device_type):
        self.buf = ctypes.create_string_buffer(64)
        self.shape = (ctypes.c_int64 * 1)(64)
        self.m = DLManagedTensor()
        self.m.dl_tensor.data = ctypes.addressof(self.buf)
        self.m.dl_tensor.device = DLDevice(device_type, 0)
        self.m.dl_tensor.ndim = 1
        self.m.dl_tensor.dtype[:] = [1, 8, 1, 0]
        self.m.dl_tensor.shape = self.shape

    def __dlpack__(self, **_kw):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.m), b"dltensor", None)


def test_dlpack_device_kinds_map_to_ours_or_are_refused(pair):
    a, _ = pair
    # kDLVulkan: no HMC backend for it.
    with pytest.raises(hmc.UnsupportedError, match="device type 7 has no HMC memory backend"):
        a.register_mem(ForeignDevice(7))
    # kDLCUDA maps to CUDA memory: registered with the CUDA backend, whose driver is not on
    # this machine (test_device.py runs the path with the driver shim).
    with pytest.raises(hmc.UnavailableError, match="libcuda"):
        a.register_mem(ForeignDevice(2))


def test_raw_address_ranges_and_device_arguments(pair):
    a, b = pair
    keep = bytearray(256)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(keep))
    h = a.register_mem((addr, 256))
    assert (h.addr, h.length) == (addr, 256)
    with pytest.raises(hmc.InvalidArgumentError, match="overlaps"):
        a.register_mem((addr + 8, 8))
    a.deregister_mem(h)
    with pytest.raises(hmc.InvalidArgumentError, match="needs device="):
        a.register_mem((addr, 256), hmc.MemType.DEVICE)
    with pytest.raises(hmc.InvalidArgumentError, match="host memory"):
        a.register_mem(keep, hmc.MemType.DEVICE)
    with pytest.raises(hmc.InvalidArgumentError, match="neither a buffer-protocol"):
        a.register_mem(object())


def test_capabilities_and_repr(pair):
    a, _ = pair
    caps = a.capabilities()
    assert caps["transport"].lower() == "tcp"
    assert caps["local_memory"] == ["Host"] or "host" in str(caps["local_memory"]).lower()
    assert caps["device_memory"] == "refused"
    assert "Engine(local_address=" in repr(a)
    assert repr(hmc.TransferOpDesc(16, 32, 8)) == "TransferOpDesc(local_addr=0x10, remote_addr=0x20, length=8)"


def test_the_context_manager_finalizes():
    with new_engine() as e:
        e.register_mem(bytearray(64))
    with pytest.raises(hmc.StateError, match="not initialized"):
        e.local_address


def test_help_reads_well():
    doc = hmc.Engine.__doc__
    assert "one-sided transfer engine" in doc
    for name in ["initialize", "register_mem", "deregister_mem", "connect", "disconnect",
                 "transfer_sync", "transfer_async", "send_notify", "get_notifies",
                 "capabilities", "finalize"]:
        assert getattr(hmc.Engine, name).__doc__, name
    assert "timeout_ms=1000" in hmc.Engine.transfer_sync.__text_signature__


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_each_transport_option_moves_bytes(transport):
    """``auto`` (the default) is shared memory to engines on this host and UCX or TCP to
    the rest; ``tcp`` is what the other tests use."""
    with hmc.Engine() as a, hmc.Engine() as b:
        a.initialize("127.0.0.1:0", {"transport": transport})
        b.initialize("127.0.0.1:0", {"transport": transport})
        src = np.frombuffer(pattern(1 << 16, 11).tobytes(), dtype=np.uint8).copy()
        dst = bytearray(1 << 16)
        hs, hd = a.register_mem(src), b.register_mem(dst)
        a.connect(b.local_address)
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, 1 << 16)])
        assert digest(dst) == digest(src)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_disconnect_and_reconnect_to_a_restarted_peer(peer_factory):
    """disconnect() of a live peer works (it raised PanicException: a timer made outside
    the runtime); a peer restarted at the same address is reported as restarted (not as an
    invalid key), and connect() reaches the new instance."""
    address = f"127.0.0.1:{free_port()}"
    p = peer_factory(fixed_address_peer, address, 1)
    name, remote = p.recv()
    with hmc.Engine() as e:
        e.initialize("127.0.0.1:0", {"transport": "tcp"})
        dst = bytearray(4096)
        hd = e.register_mem(dst)
        e.connect(name)
        e.transfer_sync(name, hmc.TransferOp.READ, [(hd.addr, remote, 4096)])
        assert bytes(dst) == pattern(4096, 1).tobytes()
        e.disconnect(name)
        with pytest.raises(hmc.NotConnectedError):
            e.transfer_sync(name, hmc.TransferOp.READ, [(hd.addr, remote, 4096)])
        e.connect(name)
        p.close()
        q = peer_factory(fixed_address_peer, address, 2)
        _, remote2 = q.recv()
        with pytest.raises(hmc.UnavailableError, match="restarted"):
            e.transfer_sync(name, hmc.TransferOp.READ, [(hd.addr, remote, 4096)])
        e.connect(name)
        e.transfer_sync(name, hmc.TransferOp.READ, [(hd.addr, remote2, 4096)])
        assert bytes(dst) == pattern(4096, 2).tobytes()
        q.conn.send("stop")


def test_a_shared_secret_admits_only_engines_that_hold_it(tmp_path):
    """auth_secret_file (an option, as in the KV API): engines with the same secret move
    bytes; one without it, or with another, cannot connect."""
    secret = tmp_path / "job.secret"
    secret.write_text("a-secret-of-the-job-0123456789\n")
    secret.chmod(0o600)
    opts = {"transport": "tcp", "auth_secret_file": str(secret)}
    with hmc.Engine() as a, hmc.Engine() as b, hmc.Engine() as c:
        a.initialize("127.0.0.1:0", opts)
        b.initialize("127.0.0.1:0", opts)
        c.initialize("127.0.0.1:0", {"transport": "tcp"})
        src = bytearray(pattern(4096, 9).tobytes())
        dst = bytearray(4096)
        hs, hd = a.register_mem(src), b.register_mem(dst)
        with pytest.raises(hmc.UnavailableError, match="auth_secret"):
            c.connect(b.local_address, timeout_ms=3000)
        a.connect(b.local_address)
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, 4096)])
        assert bytes(dst) == bytes(src)
    with pytest.raises(hmc.InvalidArgumentError, match="too short"):
        hmc.Engine().initialize("127.0.0.1:0", {"auth_secret": "short"})
    dd = hmc.kv.DataDist(1, hmc.kv.Role.PROMPT)
    dd.initialize("127.0.0.1:0", opts)
    dd.finalize()
