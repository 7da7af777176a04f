"""``hmc.mooncake``'s metadata servers, as Mooncake's ``initialize`` reads them: a bare
``host:port`` is etcd; ``http://host:port/metadata`` is Mooncake's HTTP metadata server
(here a server process speaking its protocol, ``mooncake_http_metadata_server.py``);
``redis://`` is refused by name; a scheme Mooncake has no plugin for fails with -1."""

import gc
import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hmc.mooncake as mc
from hmc.mooncake import TransferEngine

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_http_metadata_server.py")
# How long the server may take to print its port.
SERVER_START_S = 30


@pytest.fixture
def http_metadata():
    """A metadata server process speaking Mooncake's HTTP protocol: its URI."""
    proc = subprocess.Popen([sys.executable, SERVER], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + SERVER_START_S
        line = ""
        while not line.startswith("PORT ") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line.startswith("PORT "), f"the metadata server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/metadata"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def server_get(uri, key):
    """(status, body) of a GET of ``key`` on the server, as another client sees it."""
    host_port = uri.split("://", 1)[1].split("/", 1)[0]
    conn = http.client.HTTPConnection(host_port, timeout=5)
    try:
        conn.request("GET", "/metadata?key=" + key.replace("/", "%2F"))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def server_put(uri, key, body):
    host_port = uri.split("://", 1)[1].split("/", 1)[0]
    conn = http.client.HTTPConnection(host_port, timeout=5)
    try:
        conn.request("PUT", "/metadata?key=" + key.replace("/", "%2F"), body=body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_bare_host_port_is_etcd(etcd):
    """Mooncake's ``initialize("...", "127.0.0.1:2379", ...)``: the server is etcd; engines
    find each other by name, and another engine's first buffer is found through it."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("node-a", etcd, "tcp", "") == 0
    assert b.initialize("node-b", etcd, "tcp", "") == 0
    src = np.random.default_rng(5).integers(0, 256, 65536, dtype=np.uint8)
    dst = np.zeros(65536, np.uint8)
    assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert b.register_memory(src.ctypes.data, src.nbytes) == 0
    # Registration returns once the segment is in etcd: a peer reads it at once.
    first = a.get_first_buffer_address("node-b")
    assert first == src.ctypes.data
    assert a.get_first_buffer_address("node-a") == dst.ctypes.data
    assert a.transfer_sync_read("node-b", dst.ctypes.data, first, 65536) == 0
    assert (dst == src).all()
    assert a.get_first_buffer_address("node-c") == 0
    assert a.send_probe("node-c") != 0
    # Unregistering updates it at once.
    assert b.unregister_memory(src.ctypes.data) == 0
    assert a.get_first_buffer_address("node-b") == 0


def test_initialize_ext_builds_the_connection_string_as_mooncake(etcd):
    te = TransferEngine()
    assert te.initialize_ext("node-x", etcd, "tcp", "", "etcd") == 0
    # A type Mooncake has no storage plugin for: -1, as Mooncake's.
    assert TransferEngine().initialize_ext("node-y", etcd, "tcp", "", "zookeeper") == -1


def test_redis_is_refused_by_name_and_other_schemes_fail():
    with pytest.raises(NotImplementedError, match=r"redis.*use etcd .*http://"):
        TransferEngine().initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "")
    assert TransferEngine().initialize("127.0.0.1", "zk://127.0.0.1:2181", "tcp", "") == -1


def test_two_engines_through_the_http_metadata_server(http_metadata):
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1:12345", http_metadata, "tcp", "") == 0
    assert b.initialize("127.0.0.1:12347", http_metadata, "tcp", "") == 0
    # Published as Mooncake publishes an engine: its address under rpc_meta, its segment
    # under ram.
    status, body = server_get(http_metadata, "mooncake/rpc_meta/127.0.0.1:12345")
    assert status == 200
    assert json.loads(body) == {"ip_or_host_name": "127.0.0.1", "rpc_port": a.get_rpc_port()}
    assert a.get_first_buffer_address("127.0.0.1:12347") == 0
    src = np.random.default_rng(6).integers(0, 256, 1 << 20, dtype=np.uint8)
    other = np.zeros(4096, np.uint8)
    dst = np.zeros(1 << 20, np.uint8)
    assert b.batch_register_memory([src.ctypes.data, other.ctypes.data], [src.nbytes, other.nbytes]) == 0
    assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
    seg = json.loads(server_get(http_metadata, "mooncake/ram/127.0.0.1:12347")[1])
    assert [(x["addr"], x["length"]) for x in seg["buffers"]] == [(src.ctypes.data, src.nbytes), (other.ctypes.data, 4096)]
    first = a.get_first_buffer_address("127.0.0.1:12347")
    assert first == src.ctypes.data
    assert a.transfer_sync_read("127.0.0.1:12347", dst.ctypes.data, first, dst.nbytes) == 0
    assert (dst == src).all()
    dst[:] = 0
    bid = a.batch_transfer_async_read("127.0.0.1:12347", [dst.ctypes.data], [first], [dst.nbytes])
    assert bid != 0 and a.get_batch_transfer_status([bid]) == 0
    assert (dst == src).all()
    # Unregistering the first buffer makes the next one first, as Mooncake's list does.
    assert b.unregister_memory(src.ctypes.data) == 0
    assert a.get_first_buffer_address("127.0.0.1:12347") == other.ctypes.data
    # An unknown name fails at once, as Mooncake's lookup does.
    t = time.monotonic()
    assert a.send_probe("unreachable_peer:9") != 0
    assert a.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert time.monotonic() - t < mc.HTTP_TIMEOUT_S
    # A name in use is refused by the server: the second engine under it fails.
    assert TransferEngine().initialize("127.0.0.1:12345", http_metadata, "tcp", "") == -1
    # An engine that goes removes its keys (Mooncake's engine does so when destroyed).
    del b
    gc.collect()
    assert server_get(http_metadata, "mooncake/rpc_meta/127.0.0.1:12347")[0] == 404
    assert server_get(http_metadata, "mooncake/ram/127.0.0.1:12347")[0] == 404


def test_http_values_are_bounded(http_metadata, monkeypatch, caplog):
    big = json.dumps({"name": "big", "buffers": [{"addr": 1, "length": 1, "name": "x" * (2 << 20)}]})
    assert server_put(http_metadata, "mooncake/ram/big", big.encode()) == 200
    te = TransferEngine()
    assert te.initialize("127.0.0.1", http_metadata, "tcp", "") == 0
    with caplog.at_level(logging.ERROR, logger="hmc.mooncake"):
        assert te.get_first_buffer_address("big") == 0
    assert mc.MAX_METADATA_BYTES_ENV in caplog.text and "to raise it" in caplog.text
    # The limit applies to what this engine publishes too, and the variable raises it.
    monkeypatch.setenv(mc.MAX_METADATA_BYTES_ENV, "300")
    small = TransferEngine()
    assert small.initialize("node-small", http_metadata, "tcp", "") == 0
    bufs = [np.zeros(64, np.uint8) for _ in range(8)]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="hmc.mooncake"):
        assert small.batch_register_memory([x.ctypes.data for x in bufs], [64] * 8) == -1
    assert mc.MAX_METADATA_BYTES_ENV in caplog.text
    assert small.register_memory(bufs[0].ctypes.data, 64) == 0  # one buffer fits
    monkeypatch.setenv(mc.MAX_METADATA_BYTES_ENV, str(4 << 20))
    assert te.get_first_buffer_address("big") == 0  # the old engine keeps its limit
    raised = TransferEngine()
    assert raised.initialize("node-raised-2", http_metadata, "tcp", "") == 0
    assert raised.get_first_buffer_address("big") == 1


def test_a_server_that_does_not_answer_fails_in_bounded_time():
    """A listener that never answers (the kernel completes the connection, nobody reads):
    initialize gives up after HTTP_TIMEOUT_S, with -1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        t = time.monotonic()
        assert TransferEngine().initialize("127.0.0.1", f"http://127.0.0.1:{s.getsockname()[1]}/metadata", "tcp", "") == -1
        assert time.monotonic() - t < mc.HTTP_TIMEOUT_S + 2


def test_a_server_that_answers_drop_by_drop_fails_in_bounded_time():
    """A server whose answer never ends (a byte each 0.2 s of a long body): the request is
    abandoned HTTP_TIMEOUT_S after it began, not at the end of the body."""
    stop = threading.Event()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(0.2)

    def drip():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not stop.wait(0.2):
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        began = time.monotonic()
        uri = f"http://127.0.0.1:{lsock.getsockname()[1]}/metadata"
        assert TransferEngine().initialize("127.0.0.1", uri, "tcp", "") == -1
        assert time.monotonic() - began < mc.HTTP_TIMEOUT_S + 2
    finally:
        stop.set()
        t.join(5)
        lsock.close()


def test_a_metadata_uri_with_a_query_is_refused(caplog):
    with caplog.at_level(logging.ERROR, logger="hmc.mooncake"):
        assert TransferEngine().initialize("127.0.0.1", "http://127.0.0.1:1/metadata?x=1", "tcp", "") == -1
    assert "?key=" in caplog.text


def test_the_cluster_id_prefixes_the_keys_as_mooncakes(http_metadata, monkeypatch):
    monkeypatch.setenv("MC_METADATA_CLUSTER_ID", "job-7")
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("node-a", http_metadata, "tcp", "") == 0
    assert server_get(http_metadata, "mooncake/job-7/rpc_meta/node-a")[0] == 200
    assert server_get(http_metadata, "mooncake/rpc_meta/node-a")[0] == 404
    assert b.initialize("node-b", http_metadata, "tcp", "") == 0
    assert b.send_probe("node-a") == 0
    monkeypatch.delenv("MC_METADATA_CLUSTER_ID")
    assert TransferEngine().initialize("node-a", http_metadata, "tcp", "") == 0  # another cluster's name space


def test_p2phandshake_takes_a_free_port_whatever_port_is_given():
    """As Mooncake 0.3.13 (checked on it): under P2PHANDSHAKE the port of local_hostname is
    not used; the engine listens on a free one, its session name host:get_rpc_port()."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize(f"127.0.0.1:{port}", "P2PHANDSHAKE", "tcp", "") == 0
        assert a.get_rpc_port() != port
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        src = np.arange(4096, dtype=np.uint8)
        assert a.register_memory(src.ctypes.data, src.nbytes) == 0
        assert a.get_first_buffer_address(f"127.0.0.1:{a.get_rpc_port()}") == src.ctypes.data
        assert b.send_probe(f"127.0.0.1:{a.get_rpc_port()}") == 0


def test_get_rpc_port_under_etcd_is_where_the_engine_listens(etcd):
    """As Mooncake's getRpcPort: the port the engine serves on, for every form of name
    (before, a name without a port made it raise IndexError)."""
    engines = {}
    for name in ("node-port", "127.0.0.1"):
        te = TransferEngine()
        assert te.initialize(name, etcd, "tcp", "") == 0
        engines[name] = te
        socket.create_connection(("127.0.0.1", te.get_rpc_port()), timeout=5).close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    te = TransferEngine()
    assert te.initialize(f"127.0.0.1:{port}", etcd, "tcp", "") == 0
    assert te.get_rpc_port() == port
    assert engines["node-port"].send_probe(f"127.0.0.1:{port}") == 0
    assert te.send_probe("node-port") == 0
