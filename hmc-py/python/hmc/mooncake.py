"""Mooncake Transfer Engine's Python API on hmc: ``from hmc.mooncake import TransferEngine``
where Mooncake code says ``from mooncake.engine import TransferEngine``.

A :class:`TransferEngine` is one :class:`hmc.Engine`; a peer's session name is its
``host:port`` (``get_rpc_port``), dialled on first use. Calls return Mooncake's integer codes
(0 on success, negative on failure; a batch id of 0 when a submit fails) and log why at
ERROR through ``logging`` (``hmc.mooncake``).

``initialize``'s metadata server is read as Mooncake's ``parseConnectionString`` reads it:
``"P2PHANDSHAKE"`` (peers by address); a bare ``host:port`` or ``etcd://host:port[,host:port]``
(etcd: peers by the ``local_hostname`` they registered under); ``http://host:port/path``
(Mooncake's HTTP metadata server, ``mooncake_http_metadata_server``: this module is a client
of its ``GET``/``PUT``/``DELETE ?key=`` protocol, see :class:`_HttpMetadata`). ``redis://`` is
refused by name. Its protocol ``tcp`` or ``rdma`` (hmc's transports of those names):
``rdma`` where this host has no RDMA device falls back to ``tcp`` as Mooncake does (said once
in the log), and ``MC_FORCE_TCP`` set in the environment (to any value, as Mooncake reads it)
makes it ``tcp`` whatever the protocol. Others are refused by name.

An hmc engine talks to hmc engines only, not to Mooncake processes. Intended differences:
``get_batch_transfer_status`` of an unknown or already reported id returns -1 (Mooncake's
crashes); a transfer to a stopped peer fails at the call's timeout (``_TIMEOUT_MS``, 30 s:
these are the engine's one-shot transfers, which its no-progress timeout does not bound)
instead of waiting for good; after a lost connection the next call connects again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import http.client
import ipaddress
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
import weakref
from enum import IntEnum
from typing import Optional

import hmc
from hmc import work_alike_config

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "Read", "Write", "install_alias"]

_log = logging.getLogger("hmc.mooncake")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

# Mooncake's codes: 0 success; -1 a failed call; -3 an address that is not registered.
_OK, _FAILED, _NOT_REGISTERED = 0, -1, -3
# Mooncake's ERR_SOCKET (error.h): what its send_probe returns for a peer that does not answer.
_ERR_SOCKET = -102
# How long send_probe waits for a peer's listener to accept.
_PROBE_TIMEOUT_S = 2.0
_TIMEOUT_MS = 30_000
_PROTOCOLS = {"tcp": "tcp", "rdma": "rdma"}

# Metadata servers, as Mooncake's parseConnectionString and MetadataStoragePlugin::Create
# read them: "P2PHANDSHAKE", else `scheme://rest`, a bare `host:port` being etcd.
_P2P = "P2PHANDSHAKE"
_ETCD, _HTTP_SCHEMES, _REDIS = "etcd", ("http", "https"), "redis"
# The etcd namespace hmc.mooncake's engines register in, and the label under which each
# publishes its segment (its registered buffers) for another engine's
# get_first_buffer_address.
_ETCD_NAMESPACE = "mooncake"
_SEGMENT_LABEL = "mooncake.segment"
# How long a registration waits for etcd to serve the segment it published, polling.
_PUBLISH_WAIT_S = 5.0
_PUBLISH_POLL_S = 0.005
# Mooncake's HTTP plugin: 3 s for a whole request (CURLOPT_TIMEOUT_MS), the same here: each
# socket operation is given what is left of it, and a body still arriving then is abandoned.
HTTP_TIMEOUT_S = 3.0
# What one read of an answer's body asks for.
_HTTP_READ_CHUNK = 64 << 10
# The largest metadata value read from or written to a metadata server (a peer's segment
# with its buffer list, this engine's own); the environment variable raises it.
MAX_METADATA_BYTES_ENV = "HMC_MOONCAKE_MAX_METADATA_BYTES"
DEFAULT_MAX_METADATA_BYTES = 1 << 20
# How often an engine under etcd is started on a port chosen free, should another process
# take the port in between, and the engine's word for that.
_BIND_ATTEMPTS = 4
_ADDR_IN_USE = "Address already in use"
# Mooncake's switch to its TCP transport: set (to any value) means on, as its getenv reads it.
_FORCE_TCP_ENV = "MC_FORCE_TCP"
# Mooncake's key prefix (`mooncake/`, then MC_METADATA_CLUSTER_ID and a slash when set).
_CLUSTER_ENV = "MC_METADATA_CLUSTER_ID"

_said: set[str] = set()


def _say_once(key: str, msg: str, *args) -> None:
    """Logs ``msg`` at WARNING the first time ``key`` is said in this process."""
    if key not in _said:
        _said.add(key)
        _log.warning(msg, *args)


def _max_metadata_bytes() -> int:
    """The bound on a metadata value: ``$HMC_MOONCAKE_MAX_METADATA_BYTES`` or 1 MiB."""
    raw = os.environ.get(MAX_METADATA_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_METADATA_BYTES
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_METADATA_BYTES_ENV}={raw!r} is not a number of bytes") from None
    if n <= 0:
        raise ValueError(f"{MAX_METADATA_BYTES_ENV}={raw!r} must be positive")
    return n


def _too_large(what: str, n: int, limit: int) -> ValueError:
    return ValueError(
        f"{what} is {n} bytes, over the limit of {limit} bytes "
        f"(set {MAX_METADATA_BYTES_ENV} to raise it)"
    )


def _conn_string(metadata_server: str, metadata_type: str) -> str:
    """Mooncake's buildConnString: P2PHANDSHAKE as is, a string with a scheme as is, else
    ``metadata_type://metadata_server``."""
    if metadata_server == _P2P or "://" in metadata_server:
        return metadata_server
    return f"{metadata_type}://{metadata_server}"


def _split_conn_string(conn: str) -> tuple[str, str]:
    """Mooncake's parseConnectionString: ``(scheme, rest)``; ``("", P2PHANDSHAKE)``; a bare
    string is etcd."""
    if "://" in conn:
        scheme, rest = conn.split("://", 1)
        return scheme, rest
    if conn == _P2P:
        return "", _P2P
    return _ETCD, conn


class _MetadataServerError(ConnectionError):
    """A metadata server could not be reached, or answered what Mooncake's would not."""


class _HttpMetadata:
    """A client of Mooncake's HTTP metadata server (``mooncake.http_metadata_server``, and
    the HTTP plugin of its ``transfer_metadata_plugin.cpp``): ``GET``, ``PUT`` and ``DELETE``
    of ``<uri>?key=<key, percent-encoded>``, JSON values, 200 on success, 404 for a key that
    is not there. Each request is one connection that ends within :data:`HTTP_TIMEOUT_S`;
    each value is bounded by ``$HMC_MOONCAKE_MAX_METADATA_BYTES`` (1 MiB)."""

    def __init__(self, uri: str):
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme not in _HTTP_SCHEMES or not parts.hostname:
            raise ValueError(f"`{uri}` is not an http://host:port/path metadata server")
        if parts.query or parts.fragment:
            raise ValueError(f"`{uri}`: Mooncake appends `?key=` to the URI; leave the query out")
        self.uri = uri
        self._conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path or "/"
        self._limit = _max_metadata_bytes()

    def _request(self, method: str, key: str, body: Optional[bytes] = None) -> tuple[int, bytes]:
        what = f"{method} {self.uri}?key={key}"
        target = f"{self._path}?key={urllib.parse.quote(key, safe='')}"
        headers = {"Content-Type": "application/json"} if body is not None else {}
        deadline = time.monotonic() + HTTP_TIMEOUT_S

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _MetadataServerError(f"{what}: no answer within {HTTP_TIMEOUT_S} s (HTTP_TIMEOUT_S)")
            return remaining

        conn = self._conn_cls(self._host, self._port, timeout=HTTP_TIMEOUT_S)
        try:
            conn.request(method, target, body=body, headers=headers)
            sock = conn.sock  # the answer is read from it even once `conn` lets go of it
            sock.settimeout(left())
            resp = conn.getresponse()
            data = bytearray()
            while len(data) <= self._limit:
                sock.settimeout(left())
                chunk = resp.read1(min(_HTTP_READ_CHUNK, self._limit + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        except _MetadataServerError:
            raise
        except (OSError, http.client.HTTPException) as e:
            raise _MetadataServerError(f"{what}: {e}") from e
        finally:
            conn.close()
        if len(data) > self._limit:
            raise _too_large(f"the answer to {what}", len(data), self._limit)
        return resp.status, bytes(data)

    def get(self, key: str) -> Optional[dict]:
        """The JSON object under ``key``; ``None`` when the server has no such key."""
        status, data = self._request("GET", key)
        if status == 404:
            return None
        if status != 200:
            raise _MetadataServerError(f"GET {self.uri}?key={key}: HTTP {status}: {data[:200]!r}")
        try:
            value = json.loads(data)
        except ValueError as e:
            raise _MetadataServerError(f"GET {self.uri}?key={key}: not JSON ({e})") from e
        if not isinstance(value, dict):
            raise _MetadataServerError(f"GET {self.uri}?key={key}: not a JSON object")
        return value

    def put(self, key: str, value: dict) -> None:
        body = json.dumps(value, separators=(",", ":")).encode()
        if len(body) > self._limit:
            raise _too_large(f"the value of {key}", len(body), self._limit)
        status, data = self._request("PUT", key, body)
        if status != 200:
            raise _MetadataServerError(f"PUT {self.uri}?key={key}: HTTP {status}: {data[:200]!r}")

    def delete(self, key: str) -> None:
        """Removes ``key``; one already gone is not an error."""
        status, data = self._request("DELETE", key)
        if status not in (200, 404):
            raise _MetadataServerError(f"DELETE {self.uri}?key={key}: HTTP {status}: {data[:200]!r}")


def _http_unregister(client: _HttpMetadata, keys: list[str]) -> None:
    """Removes an engine's keys from the HTTP metadata server (at its collection or the
    interpreter's exit), as Mooncake's engine does when it is destroyed."""
    for key in keys:
        try:
            client.delete(key)
        except (_MetadataServerError, ValueError) as e:
            _log.warning("removing %s from %s: %s", key, client.uri, e)


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification attached to a transfer (``name``, ``msg``)."""

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


def _op(opcode) -> hmc.TransferOp:
    return hmc.TransferOp.WRITE if int(opcode) == 1 else hmc.TransferOp.READ


# Mooncake's build features, as ``mooncake.engine`` reports them: what hmc.mooncake carries
# (host memory over tcp and rdma; none of Mooncake's device or fabric protocols).
SUPPORT_CUDA = False
SUPPORT_HIP = False
SUPPORT_MUSA = False
SUPPORT_EFA = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False


class _NotCarried:
    """A class of ``mooncake.engine`` that hmc.mooncake does not carry: using it raises
    ``NotImplementedError`` naming it and what to use instead."""

    _what = ""
    _instead = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} ({self._what}) is not carried by hmc.mooncake; {self._instead}")


class CoroRPCInterface(_NotCarried):
    _what, _instead = "Mooncake's coroutine RPC", "use hmc.rpc"


class RpcInterface(_NotCarried):
    _what, _instead = "Mooncake's RPC", "use hmc.rpc"


class ReceivedData(_NotCarried):
    _what, _instead = "a message of Mooncake's RPC", "use hmc.rpc"


class ReceivedTensor(_NotCarried):
    _what, _instead = "a tensor of Mooncake's RPC", "use hmc.rpc"


class SharedSegment(_NotCarried):
    _what, _instead = "a Mooncake shared segment", "register memory with TransferEngine.register_memory"


class InnerTransferEngine(_NotCarried):
    _what, _instead = "Mooncake's C++ engine", "use TransferEngine"


def create_rpc_client(*args, **kwargs):
    raise NotImplementedError("create_rpc_client (Mooncake's RPC) is not carried by hmc.mooncake; use hmc.rpc")


def create_rpc_server(*args, **kwargs):
    raise NotImplementedError("create_rpc_server (Mooncake's RPC) is not carried by hmc.mooncake; use hmc.rpc")


def _split_host_port(hostname: str) -> tuple[str, Optional[str]]:
    """``(host, port)`` of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` (``port`` is
    ``None`` when absent); a bare IPv6 address is a host."""
    if hostname.startswith("["):
        host, _, rest = hostname[1:].partition("]")
        return host, (rest[1:] if rest.startswith(":") else None)
    if hostname.count(":") == 1:
        host, port = hostname.split(":")
        return host, port
    return hostname, None


def _listen_at(host: str, port: str = "0") -> str:
    """The engine's ``host:port`` to listen at (an IPv6 host in brackets; port 0: a free one)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_port(addr: str) -> Optional[tuple]:
    """``(host, port)`` of ``host:port`` or ``[v6]:port``; ``None`` for a name without a port
    (an etcd engine name, which the engine resolves)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _answers(where: tuple) -> bool:
    """Whether something accepts a TCP connection at ``where`` now."""
    try:
        socket.create_connection(where, timeout=_PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def _free_port(host: str) -> int:
    """A port free on ``host`` now (the kernel's choice; another process may take it before
    the engine binds it, hence _BIND_ATTEMPTS)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _is_ip(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (not a name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bind_host() -> str:
    """Where an engine whose name is not an address listens: ``$HMC_MOONCAKE_HOST``."""
    return os.environ.get("HMC_MOONCAKE_HOST", "127.0.0.1")


def _no_rdma(err: BaseException) -> bool:
    """Whether the RDMA transport failed for want of a device or of libibverbs (where
    Mooncake finds no HCA and installs its TCP transport)."""
    text = str(err)
    return "RDMA device" in text or "libibverbs" in text


class TransferEngine:
    """Mooncake's ``TransferEngine`` (see the module's docs)."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._e: Optional[hmc.Engine] = None
        self._regs: dict[int, hmc.MemHandle] = {}  # in registration order, as Mooncake's buffers
        self._lengths: dict[int, int] = {}
        self._managed: set[int] = set()
        self._peers: set[str] = set()
        self._addrs: dict[str, str] = {}  # session name -> engine address, under http
        self._batches: dict[int, list] = {}
        self._next_id = 1
        # Guards the batch ids and the connections being made (per peer: a lock and how many
        # threads wait on it, dropped with the last); registration and its publishing hold
        # _reg_lock, so that what is published is the last registration's state.
        self._lock = threading.Lock()
        self._connecting: dict[str, list] = {}
        self._reg_lock = threading.RLock()
        self._name = ""
        self._port = 0
        self._metadata = ""  # "", "etcd" or "http"
        self._http: Optional[_HttpMetadata] = None

    # ------------------------------------------------------------------ setup

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Starts the engine on ``local_hostname`` (``ip`` or ``ip:port``); 0 or -1. The
        metadata server as Mooncake reads it (see the module's docs)."""
        scheme, rest = _split_conn_string(metadata_server)
        return self.initialize_ext(local_hostname, rest, protocol, device_name, scheme)

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str) -> int:
        """``initialize`` with the metadata server's type apart (``etcd``, ``http``, ...;
        ignored for ``P2PHANDSHAKE`` and for a server that names its scheme)."""
        if protocol not in _PROTOCOLS:
            raise NotImplementedError(
                f"Mooncake's `{protocol}` protocol is not carried by hmc.mooncake; use "
                + " or ".join(_PROTOCOLS)
            )
        conn = _conn_string(metadata_server, metadata_type)
        scheme, rest = _split_conn_string(conn)
        if scheme == _REDIS:
            raise NotImplementedError(
                f"the redis metadata server `{conn}` is not carried by hmc.mooncake; use "
                "etcd (host:port or etcd://host:port), http://host:port/metadata "
                "(mooncake_http_metadata_server) or P2PHANDSHAKE"
            )
        if conn != _P2P and scheme != _ETCD and scheme not in _HTTP_SCHEMES:
            # Mooncake has no storage plugin for it and fails the same way.
            _log.error("initialize: no metadata server of type `%s` (%s); use P2PHANDSHAKE, "
                       "host:port or etcd://host:port, or http://host:port/path", scheme, conn)
            return _FAILED
        transport = _PROTOCOLS[protocol]
        if transport != "tcp" and _FORCE_TCP_ENV in os.environ:
            _say_once("force_tcp", "%s is set: using the TCP transport, as Mooncake does", _FORCE_TCP_ENV)
            transport = "tcp"
        opts = {"transport": transport}
        configured = work_alike_config.load("mooncake")
        opts.update(configured)
        name_host, name_port = _split_host_port(local_hostname)
        kw, client = {}, None
        if scheme == _ETCD:
            hosts = rest.split("/")[0]
            kw = {"metadata": f"etcd://{hosts}/{_ETCD_NAMESPACE}", "name": local_hostname}
            # Under etcd hmc's engine dials a name that is an ip:port as that address, so such
            # a name is where this engine listens; another name is looked up in etcd, and the
            # engine listens on the name's IP or $HMC_MOONCAKE_HOST (default 127.0.0.1), at a
            # free port chosen here (its local_address is then the name: the port is kept
            # for get_rpc_port).
            if _is_ip(name_host) and name_port:
                host = _listen_at(name_host, name_port)
            else:
                host = _listen_at(name_host if _is_ip(name_host) else _bind_host(), "")
        elif scheme in _HTTP_SCHEMES:
            try:
                client = _HttpMetadata(conn)
            except ValueError as err:
                _log.error("initialize: %s", err)
                return _FAILED
            # As Mooncake under a metadata server: the name is only a name, the port is chosen
            # here and published under it.
            host = _listen_at(name_host if _is_ip(name_host) else _bind_host())
        else:
            # P2PHANDSHAKE, as Mooncake: a port given is not used; the engine takes a free one
            # and its session name is host:that port (get_rpc_port).
            host = _listen_at(name_host)
        try:
            e, self._port = self._start_at(host, opts, kw, fallback="transport" not in configured)
        except hmc.HmcError as err:
            _log.error("initialize: %s", err)
            return _FAILED
        self._e, self._http = e, client
        self._name = local_hostname if kw or client else e.local_address.split("://", 1)[-1]
        self._metadata = _ETCD if kw else "http" if client else ""
        if client is not None and self._http_register() != _OK:
            e.finalize()
            self._e, self._http, self._metadata = None, None, ""
            return _FAILED
        return _OK

    @classmethod
    def _start_at(cls, host: str, opts: dict, kw: dict, fallback: bool) -> tuple[hmc.Engine, int]:
        """An engine listening at ``host`` and its port. A host with an empty port
        (``"ip:"``) gets a free port chosen here, tried again (``_BIND_ATTEMPTS`` in all)
        should another process take it first."""
        ip, port = _split_host_port(host)
        if port:
            e = cls._start(host, opts, kw, fallback)
            return e, int(e.local_address.rsplit(":", 1)[1])
        for attempt in range(_BIND_ATTEMPTS):
            port = _free_port(ip)
            try:
                return cls._start(_listen_at(ip, str(port)), opts, kw, fallback), port
            except hmc.HmcError as err:
                if _ADDR_IN_USE not in str(err) or attempt + 1 == _BIND_ATTEMPTS:
                    raise

    @staticmethod
    def _start(host: str, opts: dict, kw: dict, fallback: bool) -> hmc.Engine:
        """An engine on ``host``; when the protocol asked for RDMA (``fallback``) and this
        host has no RDMA device or verbs library, one on TCP instead, as Mooncake does."""
        e = hmc.Engine()
        try:
            e.initialize(host, opts, **kw)
            return e
        except hmc.UnavailableError as err:
            if not (fallback and opts["transport"] == "rdma" and _no_rdma(err)):
                raise
            _say_once("rdma_fallback", "no RDMA device here (%s): using the TCP transport, as Mooncake does", err)
        e = hmc.Engine()
        e.initialize(host, {**opts, "transport": "tcp"}, **kw)
        return e

    @staticmethod
    def _http_key(kind: str, name: str) -> str:
        """Mooncake's key of ``name``'s ``kind`` (``rpc_meta``: its address; ``ram``: its
        segment): ``mooncake/[<MC_METADATA_CLUSTER_ID>/]<kind>/<name>``."""
        cluster = os.environ.get(_CLUSTER_ENV, "")
        if cluster and not cluster.endswith("/"):
            cluster += "/"
        return f"mooncake/{cluster}{kind}/{name}"

    def _http_register(self) -> int:
        """Publishes this engine under its name as Mooncake's engine does: its address
        (``rpc_meta``: a name already there is refused by the server) and its segment
        (``ram``); both are removed when the engine goes."""
        rpc_key, ram_key = self._http_key("rpc_meta", self._name), self._http_key("ram", self._name)
        host, port = self._engine().local_address.split("://", 1)[-1].rsplit(":", 1)
        try:
            self._http.put(rpc_key, {"ip_or_host_name": host.strip("[]"), "rpc_port": int(port)})
        except (_MetadataServerError, ValueError) as err:
            _log.error("initialize: publishing `%s` at %s: %s", self._name, self._http.uri, err)
            return _FAILED
        weakref.finalize(self, _http_unregister, self._http, [rpc_key, ram_key])
        return self._publish_segment()

    def _publish_segment(self) -> int:
        """Publishes this engine's segment (its registered buffers, in Mooncake's JSON) for
        another engine's ``get_first_buffer_address``: to the HTTP server, or under etcd as a
        label beside the engine's record; nothing under P2PHANDSHAKE."""
        if not self._metadata:
            return _OK
        seg = {"name": self._name, "protocol": "tcp",
               "buffers": [{"name": "cpu:0", "addr": a, "length": self._lengths[a]} for a in self._regs]}
        try:
            if self._http is not None:
                self._http.put(self._http_key("ram", self._name), seg)
            else:
                blob = json.dumps(seg, separators=(",", ":")).encode()
                limit = _max_metadata_bytes()
                if len(blob) > limit:
                    raise _too_large("this engine's segment", len(blob), limit)
                self._engine().publish_label(_SEGMENT_LABEL, blob)
                self._await_label(blob)
        except (_MetadataServerError, ValueError, hmc.HmcError) as err:
            _log.error("publishing the segment of `%s`: %s", self._name, err)
            return _FAILED
        return _OK

    def _await_label(self, blob: bytes) -> None:
        """Waits (at most ``_PUBLISH_WAIT_S``) until etcd serves ``blob`` as this engine's
        segment: the engine publishes in the background, Mooncake's put returns once stored,
        and a peer told "registered" reads it at once."""
        deadline = time.monotonic() + _PUBLISH_WAIT_S
        while self._engine().fetch_label(self._name, _SEGMENT_LABEL, _TIMEOUT_MS) != blob:
            if time.monotonic() > deadline:
                _log.warning("the segment of `%s` is not in etcd after %s s; peers may read the previous one",
                             self._name, _PUBLISH_WAIT_S)
                return
            time.sleep(_PUBLISH_POLL_S)

    def _segment(self, name: str) -> Optional[dict]:
        """Another engine's published segment (``None`` when it published none)."""
        if self._http is not None:
            return self._http.get(self._http_key("ram", name))
        blob = self._engine().fetch_label(name, _SEGMENT_LABEL, _TIMEOUT_MS)
        if blob is None:
            return None
        limit = _max_metadata_bytes()
        if len(blob) > limit:
            raise _too_large(f"the segment of `{name}`", len(blob), limit)
        return json.loads(blob)

    def get_rpc_port(self) -> int:
        """The port this engine listens on (under P2PHANDSHAKE, that of its session name
        ``host:port``)."""
        self._engine()
        return self._port

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """Mooncake's topology JSON: this host's CPU, with no RDMA devices listed."""
        return json.dumps({"cpu:0": {"preferred_hca": [], "avail_hca": []}})

    def get_engine(self):
        raise NotImplementedError("get_engine (Mooncake's C++ engine object) is not carried by hmc.mooncake")

    def get_engine_ptr(self) -> int:
        raise NotImplementedError("get_engine_ptr (Mooncake's C++ engine) is not carried by hmc.mooncake")

    def warmup_efa_segment(self, segment_name: str) -> int:
        raise NotImplementedError("warmup_efa_segment (EFA) is not carried by hmc.mooncake; use send_probe")

    def _engine(self) -> hmc.Engine:
        if self._e is None:
            raise RuntimeError("call initialize() first")
        return self._e

    def _remote(self, target: str) -> str:
        """What the engine dials for the session ``target``."""
        return self._addrs.get(target, target)

    def _peer(self, target: str) -> bool:
        """Connects to ``target`` on first use. Threads that use a new peer at once connect it
        once: the others wait for that connection (as Mooncake's openSegment does)."""
        if target in self._peers:
            return True
        with self._lock:
            entry = self._connecting.setdefault(target, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                return target in self._peers or self._connect(target)
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._connecting[target]

    def _connect(self, target: str) -> bool:
        try:
            if self._http is not None:
                rpc = self._http.get(self._http_key("rpc_meta", target))
                if rpc is None:
                    _log.error("connecting to %s: no engine of that name is registered at %s", target, self._http.uri)
                    return False
                self._addrs[target] = _listen_at(str(rpc["ip_or_host_name"]), str(int(rpc["rpc_port"])))
            self._engine().connect(self._remote(target), _TIMEOUT_MS)
        except (hmc.HmcError, _MetadataServerError, ValueError, KeyError, TypeError) as err:
            _log.error("connecting to %s: %s", target, err)
            return False
        self._peers.add(target)
        return True

    def send_probe(self, peer_server_name: str) -> int:
        """Mooncake's send_probe: whether the peer answers now (0), not whether it once did;
        ``ERR_SOCKET`` (-102) where nothing answers at its address, as Mooncake. SGLang's
        failed-session probe lifts a decode session's blacklist on 0. A peer connected before
        and found gone is disconnected, so a later probe or transfer connects afresh."""
        target = peer_server_name
        if target in self._peers:
            where = _host_port(self._remote(target))
            if where is None or _answers(where):
                return _OK
            self._forget(target)
            return _ERR_SOCKET
        return _OK if self._peer(target) else _ERR_SOCKET

    def _forget(self, target: str) -> None:
        """Drops the connection to ``target`` (gone): the next use connects again."""
        self._peers.discard(target)
        try:
            self._engine().disconnect(self._remote(target), _TIMEOUT_MS)
        except hmc.HmcError as err:
            _log.debug("disconnecting from %s: %s", target, err)

    def _lost(self, target: str, err: Optional[BaseException]) -> None:
        """After a transfer failed because its connection was lost (the peer went away, or
        the connection broke: ``UnavailableError``, not a metadata mismatch or a missing
        backend), drops the connection so that the next call connects afresh, as Mooncake's
        next transfer opens a new connection; otherwise every later call to ``target`` would
        fail on the dead one."""
        if isinstance(err, hmc.UnavailableError) and not isinstance(err, (hmc.BackendUnavailableError, hmc.MismatchError)):
            self._forget(target)

    # ------------------------------------------------------------------ memory

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        with self._reg_lock:
            code = self._register(buffer_addr, capacity)
            if code == _OK and self._publish_segment() != _OK:
                self._unregister(buffer_addr)
                return _FAILED
            return code

    def _register(self, buffer_addr: int, capacity: int) -> int:
        try:
            self._regs[int(buffer_addr)] = self._engine().register_mem((int(buffer_addr), int(capacity)))
        except hmc.HmcError as err:
            _log.error("register_memory: %s", err)
            return _FAILED
        self._lengths[int(buffer_addr)] = int(capacity)
        return _OK

    def unregister_memory(self, buffer_addr: int) -> int:
        with self._reg_lock:
            code = self._unregister(buffer_addr)
            if code == _OK:
                self._publish_segment()
            return code

    def _unregister(self, buffer_addr: int) -> int:
        h = self._regs.pop(int(buffer_addr), None)
        self._lengths.pop(int(buffer_addr), None)
        if h is None:
            return _NOT_REGISTERED
        try:
            self._engine().deregister_mem(h)
        except hmc.HmcError as err:
            _log.error("unregister_memory: %s", err)
            return _FAILED
        return _OK

    def batch_register_memory(self, buffer_addresses: list[int], capacities: list[int], location: str = "*") -> int:
        with self._reg_lock:
            for k, (a, n) in enumerate(zip(buffer_addresses, capacities)):
                if self._register(a, n) != _OK:
                    for b in buffer_addresses[:k]:
                        self._unregister(b)
                    return _FAILED
            if self._publish_segment() != _OK:
                for b in buffer_addresses:
                    self._unregister(b)
                return _FAILED
            return _OK

    def batch_unregister_memory(self, buffer_addresses: list[int]) -> int:
        with self._reg_lock:
            codes = [self._unregister(a) for a in buffer_addresses]
            if _OK in codes:
                self._publish_segment()
            return next((c for c in codes if c != _OK), _OK)

    def allocate_managed_buffer(self, length: int) -> int:
        """``length`` bytes allocated and registered here; their address (0 if it failed)."""
        addr = _libc.malloc(int(length)) or 0
        if addr and self.register_memory(addr, length) != _OK:
            _libc.free(addr)
            return 0
        if addr:
            self._managed.add(addr)
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        if int(buffer_addr) not in self._managed:
            return _NOT_REGISTERED
        code = self.unregister_memory(buffer_addr)
        self._managed.discard(int(buffer_addr))
        _libc.free(int(buffer_addr))
        return code

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The first buffer the engine ``segment_name`` registered and still holds (0 when
        none): this engine's own, or, under etcd or an HTTP metadata server, another's as it
        published it. Under P2PHANDSHAKE another engine's is not carried."""
        own = self._engine().local_address.split("://", 1)[-1]
        if segment_name in (own, own.rsplit(":", 1)[0], self._name):
            return next(iter(self._regs), 0)
        if not self._metadata:
            raise NotImplementedError(
                "get_first_buffer_address of another engine under P2PHANDSHAKE is not carried by "
                "hmc.mooncake; use an etcd or http metadata server, or pass the peer's buffer "
                "addresses over your own side channel"
            )
        try:
            seg = self._segment(segment_name)
            if not seg or not seg.get("buffers"):
                return 0
            return int(seg["buffers"][0]["addr"])
        except (hmc.HmcError, _MetadataServerError, ValueError, KeyError, TypeError, IndexError) as err:
            _log.error("get_first_buffer_address(%s): %s", segment_name, err)
            return 0

    def write_bytes_to_buffer(self, dest_address: int, src: bytes, length: int) -> int:
        ctypes.memmove(int(dest_address), bytes(src), int(length))
        return _OK

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        return ctypes.string_at(int(source_address), int(length))

    # ------------------------------------------------------------------ transfers

    def _descs(self, buffers, peers, lengths):
        # 3-tuples, which the engine reads as (local, remote, length): a tenth of the cost
        # of a TransferOpDesc object each (SGLang's batches are a thousand blocks or more).
        if not (len(buffers) == len(peers) == len(lengths)):
            raise hmc.InvalidArgumentError(
                f"buffers, peer addresses and lengths differ in length ({len(buffers)}, "
                f"{len(peers)}, {len(lengths)})"
            )
        return list(zip(buffers, peers, lengths))

    def _sync(self, target, op, buffers, peers, lengths, notify=None) -> int:
        if not self._peer(target):
            return _FAILED
        e, remote = self._engine(), self._remote(target)
        try:
            e.transfer_sync(remote, op, self._descs(buffers, peers, lengths), _TIMEOUT_MS)
            if notify is not None:
                e.send_notify(remote, str(notify.msg).encode(), _TIMEOUT_MS, name=str(notify.name))
        except hmc.HmcError as err:
            _log.error("transfer with %s: %s", target, err)
            self._lost(target, err)
            return _FAILED
        return _OK

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        return self._sync(target_hostname, hmc.TransferOp.READ, [buffer], [peer_buffer_address], [length])

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        return self._sync(target_hostname, hmc.TransferOp.WRITE, [buffer], [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, opcode, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        return self._sync(target_hostname, _op(opcode), [buffer], [peer_buffer_address], [length], notify)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], transport_hint: str = "") -> int:
        return self._sync(target_hostname, hmc.TransferOp.READ, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], transport_hint: str = "") -> int:
        return self._sync(target_hostname, hmc.TransferOp.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], opcode, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        return self._sync(target_hostname, _op(opcode), buffers, peer_buffer_addresses, lengths, notify)

    def _submit(self, target, op, buffers, peers, lengths) -> int:
        if not self._peer(target):
            return 0
        try:
            req = self._engine().transfer_async(self._remote(target), op, self._descs(buffers, peers, lengths), _TIMEOUT_MS)
        except hmc.HmcError as err:
            _log.error("transfer with %s: %s", target, err)
            self._lost(target, err)
            return 0
        with self._lock:
            bid, self._next_id = self._next_id, self._next_id + 1
        self._batches[bid] = [req, target]
        return bid

    def batch_transfer_async_read(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], transport_hint: str = "") -> int:
        return self._submit(target_hostname, hmc.TransferOp.READ, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_write(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], transport_hint: str = "") -> int:
        return self._submit(target_hostname, hmc.TransferOp.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], lengths: list[int], opcode, transport_hint: str = "") -> int:
        return self._submit(target_hostname, _op(opcode), buffers, peer_buffer_addresses, lengths)

    def get_batch_transfer_status(self, batch_ids: list[int]) -> int:
        """Waits for every batch of ``batch_ids`` and forgets them: 0 when all completed,
        -1 when one failed or an id is unknown."""
        code = _OK
        for bid in batch_ids:
            b = self._batches.pop(int(bid), None)
            if b is None:
                _log.error("get_batch_transfer_status: no batch %s (unknown, or already reported)", bid)
                code = _FAILED
                continue
            if b[0].wait() != hmc.TransferStatus.COMPLETED:
                err = b[0].error()
                _log.error("batch %s with %s: %s", bid, b[1], err)
                self._lost(b[1], err)
                code = _FAILED
        return code

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        """A WRITE in the background; its id for ``transfer_check_status`` (0 if it failed)."""
        return self._submit(target_hostname, hmc.TransferOp.WRITE, [buffer], [peer_buffer_address], [length])

    def transfer_check_status(self, batch_id: int) -> int:
        """0 while in progress, 1 once completed, -1 on failure (then the id is forgotten)."""
        b = self._batches.get(int(batch_id))
        if b is None:
            return _FAILED
        st = b[0].status()
        if st == hmc.TransferStatus.WAITING:
            return 0
        self._batches.pop(int(batch_id), None)
        if st == hmc.TransferStatus.COMPLETED:
            return 1
        err = b[0].error()
        _log.error("transfer %s with %s: %s", batch_id, b[1], err)
        self._lost(b[1], err)
        return _FAILED

    # ------------------------------------------------------------------ notifications

    def get_notifies(self) -> list[TransferNotify]:
        """Notifications received since the last call."""
        out = []
        for frm, name, msg, failed in self._engine().get_notifications():
            if failed is not None:
                _log.warning("a transfer from %s failed: %s", frm, failed)
                continue
            out.append(TransferNotify(name, bytes(msg).decode(errors="replace")))
        return out


def install_alias(override: bool = False) -> None:
    """Makes ``import mooncake.engine`` (and ``from mooncake.engine import TransferEngine``)
    resolve to ``hmc.mooncake`` in this process (``HMC_ALIAS=mooncake`` does it at start-up,
    for child processes too). Refused when the real ``mooncake`` is installed, unless
    ``override``."""
    import sys

    from . import _alias

    me = sys.modules[__name__]
    _alias.install("mooncake", {"mooncake": _alias.package("mooncake", engine=me), "mooncake.engine": me}, override)
