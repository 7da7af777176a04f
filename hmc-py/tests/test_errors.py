"""Every error class from a real failure, with messages that say what to do."""

import _thread
import socket
import threading
import time

import pytest

import hmc
from conftest import new_engine
from peers import buffers_peer


def test_error_classes_derive_from_the_builtins():
    assert issubclass(hmc.TimeoutError, TimeoutError)
    assert issubclass(hmc.InvalidArgumentError, ValueError)
    assert issubclass(hmc.NotRegisteredError, ValueError)
    assert issubclass(hmc.NotConnectedError, ConnectionError)
    assert issubclass(hmc.UnavailableError, ConnectionError)
    assert issubclass(hmc.UnknownKeyError, KeyError)
    assert issubclass(hmc.UnsupportedError, NotImplementedError)
    for name in hmc._errors.__all__:
        assert issubclass(getattr(hmc, name), hmc.HmcError)


@pytest.fixture
def stopped_peer(peer_factory):
    """A connected engine and a peer process that then stops answering (SIGSTOP)."""
    p = peer_factory(buffers_peer, 1 << 20)
    address, arr_addr, _, _ = p.recv()
    e = new_engine()
    buf = bytearray(1 << 20)
    h = e.register_mem(buf)
    e.connect(address)
    e.transfer_sync(address, hmc.TransferOp.WRITE, [(h.addr, arr_addr, 4096)])
    p.stop()
    yield e, address, h, arr_addr
    p.cont()
    e.finalize()


def test_timeout_against_a_silent_peer(stopped_peer):
    e, address, h, remote = stopped_peer
    t = time.monotonic()
    with pytest.raises(hmc.TimeoutError, match="pass a longer timeout"):
        e.transfer_sync(address, hmc.TransferOp.READ, [(h.addr, remote, 1 << 20)], timeout_ms=300)
    assert time.monotonic() - t < 5
    req = e.transfer_async(address, hmc.TransferOp.WRITE, [(h.addr, remote, 4096)], timeout_ms=200)
    assert req.wait() == hmc.TransferStatus.TIMEOUT
    assert isinstance(req.error(), hmc.TimeoutError)


def test_finalize_cancels_transfers_in_flight_instead_of_waiting_for_them(stopped_peer):
    """finalize() with a transfer stuck on a stopped peer (15 s timeout) returns at once:
    the transfer is cancelled (CancelledError), nothing waits for its deadline."""
    e, address, h, remote = stopped_peer
    req = e.transfer_async(address, hmc.TransferOp.READ, [(h.addr, remote, 1 << 20)], timeout_ms=15_000)
    time.sleep(0.2)
    assert req.status() == hmc.TransferStatus.WAITING
    t = time.monotonic()
    e.finalize()
    assert time.monotonic() - t < 3
    assert req.wait() == hmc.TransferStatus.FAILED
    assert isinstance(req.error(), hmc.CancelledError), req.error()
    with pytest.raises(hmc.StateError):
        e.transfer_sync(address, hmc.TransferOp.READ, [(h.addr, remote, 16)])


def test_connect_to_a_peer_that_accepts_and_never_answers_times_out():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    with new_engine() as e:
        with pytest.raises(hmc.TimeoutError, match="connecting to"):
            e.connect("127.0.0.1:%d" % silent.getsockname()[1], timeout_ms=300)
    silent.close()


def test_ctrl_c_interrupts_a_blocking_transfer_and_cancels_it(stopped_peer):
    e, address, h, remote = stopped_peer
    threading.Timer(0.3, _thread.interrupt_main).start()
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        e.transfer_sync(address, hmc.TransferOp.READ, [(h.addr, remote, 1 << 20)], timeout_ms=60_000)
    assert time.monotonic() - t < 5
    # A wait on an asynchronous request: interrupted, and the request is cancelled.
    req = e.transfer_async(address, hmc.TransferOp.READ, [(h.addr, remote, 4096)], timeout_ms=60_000)
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        req.wait()
    assert req.wait(timeout_ms=5000) == hmc.TransferStatus.FAILED
    assert isinstance(req.error(), hmc.CancelledError)
    # The engine still deregisters cleanly: nothing holds the memory any more.
    e.deregister_mem(h)


def test_address_outside_any_registered_region(pair):
    a, b = pair
    src, dst = bytearray(4096), bytearray(4096)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)
    with pytest.raises(hmc.NotRegisteredError, match="remote range .* is in no region registered"):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr + (1 << 30), 8)])
    with pytest.raises(hmc.NotRegisteredError, match="runs past the end"):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr + 4000, 200)])
    with pytest.raises(hmc.NotRegisteredError, match="local range"):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr - 64, hd.addr, 8)])


def test_deregistered_memory_is_unreachable(pair):
    a, b = pair
    src, dst = bytearray(b"x" * 4096), bytearray(4096)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)
    b.deregister_mem(hd)
    with pytest.raises(hmc.NotRegisteredError, match="register that memory"):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, 4096)])
    assert dst == bytearray(4096)
    hd = b.register_mem(dst)
    a.deregister_mem(hs)
    with pytest.raises(hmc.NotRegisteredError, match="local range"):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, 8)])
    with pytest.raises(hmc.InvalidArgumentError, match="is not registered here"):
        a.deregister_mem(hs)


def test_unknown_peer(pair):
    a, _ = pair
    h = a.register_mem(bytearray(64))
    with pytest.raises(hmc.NotConnectedError, match="call connect first"):
        a.transfer_sync("127.0.0.1:9", hmc.TransferOp.WRITE, [(h.addr, 0, 8)])
    with pytest.raises(hmc.NotConnectedError):
        a.send_notify("127.0.0.1:9", b"x")


def test_nobody_listening_is_unavailable():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    with new_engine() as e:
        with pytest.raises(hmc.UnavailableError, match="Connection refused"):
            e.connect("127.0.0.1:%d" % free)
    with pytest.raises(hmc.UnavailableError, match="connect"):
        hmc.rpc.Client("127.0.0.1:%d" % free, connect_timeout_ms=500)


def test_invalid_arguments():
    with pytest.raises(hmc.InvalidArgumentError, match="unknown option `max_region`; known:"):
        hmc.Engine().initialize("127.0.0.1:0", {"max_region": "1"})
    with pytest.raises(hmc.InvalidArgumentError, match="no transport named `carrier-pigeon`; known: tcp, ucx, shm, rdma, auto .*plugin_path"):
        hmc.Engine().initialize("127.0.0.1:0", {"transport": "carrier-pigeon"})
    with new_engine() as e:
        with pytest.raises(hmc.InvalidArgumentError, match="cannot register 0 bytes"):
            e.register_mem(bytearray())
        with pytest.raises(hmc.InvalidArgumentError, match="TransferOpDesc"):
            e.transfer_sync(e.local_address, hmc.TransferOp.WRITE, ["nonsense"])


def test_state_errors():
    e = new_engine()
    peer = new_engine()
    e.connect(peer.local_address)
    with pytest.raises(hmc.StateError, match="already connected"):
        e.connect(peer.local_address)
    with pytest.raises(hmc.StateError, match="already initialized"):
        e.initialize("127.0.0.1:0")
    e.finalize()
    e.finalize()  # idempotent
    with pytest.raises(hmc.StateError, match="call initialize"):
        e.register_mem(bytearray(8))
    peer.finalize()


def test_limits_name_the_option():
    with new_engine(max_regions="1") as e:
        e.register_mem(bytearray(64))
        with pytest.raises(hmc.LimitError, match="max_regions"):
            e.register_mem(bytearray(64))


def test_device_memory_without_its_driver_is_unavailable_naming_it():
    keep = bytearray(4096)
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(keep))
    with new_engine() as e:
        # No libcuda on this machine (test_device.py runs the path with the driver shim).
        with pytest.raises(hmc.UnavailableError, match="libcuda"):
            e.register_mem((addr, 4096), hmc.MemType.DEVICE, device="cuda:0")
        with pytest.raises(hmc.InvalidArgumentError, match="use cuda, rocm"):
            e.register_mem((addr, 4096), hmc.MemType.DEVICE, device="tpu:0")


def test_cancelled_requests(pair):
    a, b = pair
    n = 64 << 20
    src, dst = bytearray(n), bytearray(n)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)
    req = a.transfer_async(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, hd.addr, n)], timeout_ms=30_000)
    req.cancel()
    assert req.wait() == hmc.TransferStatus.FAILED
    err = req.error()
    assert isinstance(err, hmc.CancelledError) and "was cancelled" in str(err)


def test_a_forked_child_is_told_to_use_spawn(pair):
    import os

    pid = os.fork()
    if pid == 0:  # the child: the runtime's threads stayed in the parent
        code = 1
        try:
            hmc.Engine().initialize("127.0.0.1:0", {"transport": "tcp"})
        except hmc.StateError as e:
            code = 0 if "'spawn'" in str(e) else 2
        except BaseException:  # noqa: BLE001 - any other outcome fails the test
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
