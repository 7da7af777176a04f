"""RPC from Python: a server with Python handlers, the demo methods, statuses and
deadlines, and many calling threads."""

import threading
import time

import pytest

import hmc
from hmc import rpc


@pytest.fixture
def server():
    s = rpc.Server("127.0.0.1:0", workers=4)
    s.register(1000, lambda p: p[::-1])
    s.register(1001, lambda p: bytearray(p) + b"!")

    def fails(p):
        raise ValueError("no " + p.decode())

    def status(p):
        raise hmc.RpcError("teapot", status=1418)

    def slow(p):
        time.sleep(1.0)
        return p

    s.register(1002, fails)
    s.register(1003, status)
    s.register(1004, slow)
    s.register(1005, lambda p: 42)
    s.start()
    yield s
    s.shutdown()


def test_python_handlers_and_the_demo_methods(server):
    c = rpc.Client(server.address)
    assert c.call(1000, b"hello") == b"olleh"
    assert c.call(1001, b"hi") == b"hi!"
    assert c.echo(b"\x00" * 100_000) == b"\x00" * 100_000
    assert c.uppercase("mixed Case") == "MIXED CASE"
    r = c.complex("label", [3, 5, 8])
    assert r == {"label": "LABEL", "count": 3, "sum": 16, "min": 3, "max": 8, "mean": 16 / 3}


def test_handler_failures_become_statuses(server):
    c = rpc.Client(server.address)
    with pytest.raises(hmc.RpcError, match="handler raised ValueError: no way") as e:
        c.call(1002, b"way")
    assert e.value.status_name == "INTERNAL"
    with pytest.raises(hmc.RpcError, match="teapot") as e:
        c.call(1003, b"")
    assert e.value.status == 1418
    with pytest.raises(hmc.RpcError, match="not bytes"):
        c.call(1005, b"")
    with pytest.raises(hmc.RpcError) as e:
        c.call(4242, b"")
    assert e.value.status_name == "UNKNOWN_METHOD"


def test_a_deadline_raises_timeout(server):
    c = rpc.Client(server.address)
    t = time.monotonic()
    with pytest.raises(hmc.TimeoutError):
        c.call(1004, b"x", timeout_ms=200)
    assert time.monotonic() - t < 0.9


def test_registering_after_start_is_refused(server):
    with pytest.raises(hmc.StateError, match="register every method before"):
        server.register(2000, lambda p: p)


def test_many_threads_share_one_client_while_handlers_run(server):
    c = rpc.Client(server.address)
    errors = []

    def worker(i):
        try:
            for j in range(50):
                msg = f"{i}-{j}".encode()
                assert c.call(1000, msg) == msg[::-1]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_serve_blocks_until_shutdown():
    s = rpc.Server("127.0.0.1:0")
    s.register(1000, lambda p: p)
    s.start()
    t = threading.Thread(target=s.serve)
    t.start()
    assert rpc.Client(s.address).call(1000, b"x") == b"x"
    s.shutdown()
    t.join(10)
    assert not t.is_alive()


def test_a_handler_may_drive_the_engine(pair):
    """Handlers run on worker threads outside the runtime, so blocking hmc calls work in
    them: here a call makes the server's engine WRITE into the caller's buffer."""
    a, b = pair
    src, dst = bytearray(b"r" * 4096), bytearray(4096)
    hs, hd = a.register_mem(src), b.register_mem(dst)
    a.connect(b.local_address)

    def push(payload):
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE, [(hs.addr, int(payload), 4096)])
        return b"ok"

    s = rpc.Server("127.0.0.1:0", demo=False)
    s.register(1000, push)
    with s:  # starts it, and shuts it down at the end
        assert rpc.Client(s.address).call(1000, str(hd.addr).encode()) == b"ok"
    assert dst == src
