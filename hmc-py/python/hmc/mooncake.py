"""Mooncake Transfer Engine's Python API on hmc: ``from hmc.mooncake import TransferEngine``
where Mooncake code says ``from mooncake.engine import TransferEngine``.

A :class:`TransferEngine` is one :class:`hmc.Engine`; a peer's session name is its
``host:port`` (``get_rpc_port``), dialled on first use. Calls return Mooncake's integer codes
(0 on success, negative on failure; a batch id of 0 when a submit fails) and log why at
ERROR through ``logging`` (``hmc.mooncake``). ``initialize``'s metadata server is
``"P2PHANDSHAKE"`` (peers by address) or ``etcd://host:port[,host:port]`` (peers by the
``local_hostname`` they registered under); its protocol ``tcp`` or ``rdma`` (hmc's
transports of those names); others are refused by name.

An hmc engine talks to hmc engines only, not to Mooncake processes. Intended differences:
``get_batch_transfer_status`` of an unknown or already reported id returns -1 (Mooncake's
crashes); a transfer ends after the engine's no-progress timeout instead of waiting on a
stopped peer for good.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import json
import logging
import os
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
_TIMEOUT_MS = 30_000
_PROTOCOLS = {"tcp": "tcp", "rdma": "rdma"}


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


class TransferEngine:
    """Mooncake's ``TransferEngine`` (see the module's docs)."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._e: Optional[hmc.Engine] = None
        self._regs: dict[int, hmc.MemHandle] = {}
        self._managed: set[int] = set()
        self._peers: set[str] = set()
        self._batches: dict[int, list] = {}
        self._next_id = 1

    # ------------------------------------------------------------------ setup

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Starts the engine on ``local_hostname`` (``ip`` or ``ip:port``); 0 or -1."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str) -> int:
        if protocol not in _PROTOCOLS:
            raise NotImplementedError(
                f"Mooncake's `{protocol}` protocol is not carried by hmc.mooncake; use "
                + " or ".join(_PROTOCOLS)
            )
        opts = {"transport": _PROTOCOLS[protocol]}
        opts.update(work_alike_config.load("mooncake"))
        kw = {}
        if metadata_server.startswith("etcd://"):
            hosts = metadata_server[len("etcd://"):].split("/")[0]
            kw = {"metadata": f"etcd://{hosts}/mooncake", "name": local_hostname}
        elif metadata_server != "P2PHANDSHAKE":
            raise NotImplementedError(
                f"the metadata server `{metadata_server}` is not carried by hmc.mooncake; use "
                "P2PHANDSHAKE or etcd://host:port"
            )
        host = local_hostname if ":" in local_hostname else f"{local_hostname}:0"
        if kw:
            # Under etcd the name is what peers dial; the engine binds the name's address when
            # it is one, else $HMC_MOONCAKE_HOST (default 127.0.0.1).
            name_host = local_hostname.rsplit(":", 1)[0] if ":" in local_hostname else local_hostname
            try:
                ipaddress.ip_address(name_host)
            except ValueError:
                host = os.environ.get("HMC_MOONCAKE_HOST", "127.0.0.1") + ":0"
        try:
            e = hmc.Engine()
            e.initialize(host, opts, **kw)
        except hmc.HmcError as err:
            _log.error("initialize: %s", err)
            return _FAILED
        self._e = e
        return _OK

    def get_rpc_port(self) -> int:
        """The port of this engine's session name ``host:port``."""
        return int(self._engine().local_address.rsplit(":", 1)[1])

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

    def _peer(self, target: str) -> bool:
        if target in self._peers:
            return True
        try:
            self._engine().connect(target, _TIMEOUT_MS)
        except hmc.HmcError as err:
            _log.error("connecting to %s: %s", target, err)
            return False
        self._peers.add(target)
        return True

    def send_probe(self, peer_server_name: str) -> int:
        return _OK if self._peer(peer_server_name) else _FAILED

    # ------------------------------------------------------------------ memory

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        try:
            self._regs[int(buffer_addr)] = self._engine().register_mem((int(buffer_addr), int(capacity)))
        except hmc.HmcError as err:
            _log.error("register_memory: %s", err)
            return _FAILED
        return _OK

    def unregister_memory(self, buffer_addr: int) -> int:
        h = self._regs.pop(int(buffer_addr), None)
        if h is None:
            return _NOT_REGISTERED
        try:
            self._engine().deregister_mem(h)
        except hmc.HmcError as err:
            _log.error("unregister_memory: %s", err)
            return _FAILED
        return _OK

    def batch_register_memory(self, buffer_addresses: list[int], capacities: list[int], location: str = "*") -> int:
        for k, (a, n) in enumerate(zip(buffer_addresses, capacities)):
            if self.register_memory(a, n) != _OK:
                for b in buffer_addresses[:k]:
                    self.unregister_memory(b)
                return _FAILED
        return _OK

    def batch_unregister_memory(self, buffer_addresses: list[int]) -> int:
        codes = [self.unregister_memory(a) for a in buffer_addresses]
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
        """The first registered buffer of this engine (``segment_name`` its own session
        name); another engine's is not carried."""
        own = self._engine().local_address.split("://", 1)[-1]
        if segment_name not in (own, own.rsplit(":", 1)[0]):
            raise NotImplementedError(
                "get_first_buffer_address of another engine is not carried by hmc.mooncake; "
                "pass the peer's buffer addresses over your own side channel"
            )
        return min(self._regs) if self._regs else 0

    def write_bytes_to_buffer(self, dest_address: int, src: bytes, length: int) -> int:
        ctypes.memmove(int(dest_address), bytes(src), int(length))
        return _OK

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        return ctypes.string_at(int(source_address), int(length))

    # ------------------------------------------------------------------ transfers

    def _descs(self, buffers, peers, lengths):
        return [hmc.TransferOpDesc(int(b), int(p), int(n)) for b, p, n in zip(buffers, peers, lengths)]

    def _sync(self, target, op, buffers, peers, lengths, notify=None) -> int:
        if not self._peer(target):
            return _FAILED
        e = self._engine()
        try:
            e.transfer_sync(target, op, self._descs(buffers, peers, lengths), _TIMEOUT_MS)
            if notify is not None:
                e.send_notify(target, str(notify.msg).encode(), _TIMEOUT_MS, name=str(notify.name))
        except hmc.HmcError as err:
            _log.error("transfer with %s: %s", target, err)
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
            req = self._engine().transfer_async(target, op, self._descs(buffers, peers, lengths), _TIMEOUT_MS)
        except hmc.HmcError as err:
            _log.error("transfer with %s: %s", target, err)
            return 0
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
                _log.error("batch %s with %s: %s", bid, b[1], b[0].error())
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
        del self._batches[int(batch_id)]
        if st == hmc.TransferStatus.COMPLETED:
            return 1
        _log.error("transfer %s with %s: %s", batch_id, b[1], b[0].error())
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
