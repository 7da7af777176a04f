"""``nixl._api`` on hmc: ``nixl_agent`` and its configuration and handles, with NIXL 1.5.1's
method names, argument orders, defaults, return values, state strings and exception types.

An agent is one :class:`hmc.Engine`. Its metadata (``get_agent_metadata``) is the engine's
blob with the agent's name; notifications carry the sender's agent name. NIXL's backend
``"UCX"`` (its default, what vLLM passes) selects hmc's default transport choice (``auto``:
cross-memory attach to a peer on this host, UCX or TCP to others); hmc's own transports
(``tcp``, ``shm``, ``ucx``, ``rdma``, ``auto``) are backends too. One transport per agent.

Intended differences from NIXL (see the behaviour table of
docs/guide/port-from-nixl-mooncake.md): a transfer that makes no progress for the engine's
``no_progress_timeout_ms`` ends ``"ERR"`` instead of staying ``"PROC"``; releasing a
transfer in flight cancels it (no late bytes over tcp and shm); the
agent may be used from several threads; the failure notice hmc sends for a failed transfer
is logged at the target, because NIXL's notification map cannot carry it.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import time
from enum import Enum
from typing import Optional, Union

import numpy as np

import hmc
from hmc import work_alike_config

from . import _bindings as nixlBind
from .logging import get_logger

logger = get_logger(__name__)

DEFAULT_COMM_PORT = nixlBind.DEFAULT_COMM_PORT

# The prefix of an hmc agent's metadata: a NIXL agent's (or anything else) is refused by it.
_MAGIC = b"HMCNIXL1"
# hmc's transports, and NIXL's name that means "the default choice".
_TRANSPORTS = {"UCX": "auto", "auto": "auto", "tcp": "tcp", "shm": "shm", "ucx": "ucx", "rdma": "rdma"}
# NIXL backends for storage and other fabrics that hmc does not carry.
_STORAGE = ("POSIX", "GDS", "GDS_MT", "OBJ", "HF3FS", "AZURE_BLOB", "GUSLI", "LIBFABRIC", "UCCL", "MOONCAKE", "GPUNETIO")
# The engine's transport (its capabilities' name) as the `transport` option names it.
_TRANSPORT_NAMES = {
    "Tcp": "tcp", "Ucx": "ucx", "Rdma": "rdma", "Shm": "shm",
    "LocalFirst": "auto (shared memory to this host, tcp to others)",
}
# check_xfer_state: polls of one handle closer than this are a caller spinning on it ...
_SPIN_GAP_NS = 50_000
# ... which then waits for the transfer's end for at most this long per poll.
_SPIN_WAIT_MS = 1
# NIXL's operation codes as hmc's.
_OPS = {nixlBind.NIXL_READ: hmc.TransferOp.READ, nixlBind.NIXL_WRITE: hmc.TransferOp.WRITE}
# How many completed posts per remote agent estimate_xfer_cost fits its line to.
_COST_SAMPLES = 32
# How long a call that needs the peer may wait (its metadata, a notification).
_TIMEOUT_MS = int(os.environ.get("HMC_NIXL_TIMEOUT_MS", "5000"))


def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _name(agent) -> str:
    return agent.decode() if isinstance(agent, (bytes, bytearray)) else str(agent)


# hmc's error classes as NIXL's, first match wins (subclasses before their bases). A peer
# that could not be reached, or whose metadata service failed, is NIXL's remote disconnect
# (stacks drop such a peer); anything else unnamed is a backend error.
_ERROR_CLASSES = (
    (hmc.MismatchError, nixlBind.nixlMismatchError),
    (hmc.PeerGoneError, nixlBind.nixlRemoteDisconnectError),
    (hmc.BackendUnavailableError, nixlBind.nixlBackendError),
    (hmc.NotRegisteredError, nixlBind.nixlNotFoundError),
    (hmc.InvalidArgumentError, nixlBind.nixlInvalidParamError),
    (hmc.LimitError, nixlBind.nixlInvalidParamError),
    (hmc.NotConnectedError, nixlBind.nixlNotFoundError),
    (hmc.UnavailableError, nixlBind.nixlRemoteDisconnectError),
    (hmc.CancelledError, nixlBind.nixlCancelledError),
    (hmc.StateError, nixlBind.nixlNotAllowedError),
    (hmc.UnsupportedError, nixlBind.nixlNotSupportedError),
)


def _nixl_error(e: BaseException) -> BaseException:
    """The NIXL exception for an hmc error (its message kept)."""
    msg = f"{type(e).__name__}: {e}"
    cls = next((theirs for ours, theirs in _ERROR_CLASSES if isinstance(e, ours)), nixlBind.nixlBackendError)
    return cls(msg)


class nixl_prepped_dlist_handle:
    """A prepared descriptor list (``prep_xfer_dlist``): local, or of one remote agent."""

    __slots__ = ("_list", "_agent", "_remote", "_released")

    def __init__(self, agent, prepared, remote: Optional[str]):
        self._agent = agent
        self._list = prepared
        self._remote = remote
        self._released = False

    def __repr__(self) -> str:
        return f"nixl_prepped_dlist_handle({self._remote or 'local'}, released={self._released})"

    def release(self):
        if self._released:
            # NIXL accepts a second release of a freed handle (undefined behaviour in its
            # C++); here it is a clear error, so the caller's bookkeeping bug shows.
            raise nixlBind.nixlInvalidParamError(
                "NIXL_ERR_INVALID_PARAM: this prepared list was released already"
            )
        self._released = True
        self._list = None

    def _live(self):
        if self._released:
            raise nixlBind.nixlInvalidParamError("this prepared list was released")
        return self._list


class nixl_xfer_handle:
    """A transfer request (``make_prepped_xfer``, ``initialize_xfer``)."""

    __slots__ = ("_agent", "_xfer", "_make", "_notif", "_post_us", "_posted", "_sampled", "_released", "_remote",
                 "_count", "_polled_ns", "_post_at_us", "_done_at_us")

    def __init__(self, agent, make, notif: bytes, remote: str):
        self._agent = agent
        self._make = make
        self._notif = notif
        self._remote = remote
        self._xfer = make(notif)
        self._post_us = 0
        self._post_at_us = 0  # wall clock (µs since the epoch) when the last post began
        self._done_at_us = 0  # ... and when check_xfer_state first saw it done
        self._posted = False
        self._sampled = True  # nothing to learn from until a post completes
        self._released = False
        self._count = 0  # telemetry's descCount when NIXL counts them as given; else merged
        self._polled_ns = 0  # when check_xfer_state last found it in progress

    def __repr__(self) -> str:
        return f"nixl_xfer_handle(released={self._released})"

    def release(self):
        if not self._released:
            self._released = True
            if self._xfer is not None:
                self._xfer.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 (best effort at teardown, as NIXL's)
            pass

    def _live(self):
        if self._released:
            raise nixlBind.nixlInvalidParamError("this transfer handle was released")
        return self._xfer


nixl_backend_handle = int


class nixl_thread_sync_t(Enum):
    """Thread synchronisation modes (accepted; an hmc agent is thread-safe in every mode)."""

    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT


class nixl_agent_config:
    """NIXL's agent configuration. ``backends`` chooses the transport (above);
    ``capture_telemetry`` enables ``get_xfer_telemetry``; the progress and listen threads,
    their port and ``num_threads`` are accepted (hmc's engine has its own threads; the
    listen-thread metadata exchange is not carried yet)."""

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = DEFAULT_COMM_PORT,
        capture_telemetry: bool = False,
        num_threads: int = 0,
        backends: list[str] = ["UCX"],  # noqa: B006 (NIXL's signature)
        sync_mode: Optional[nixl_thread_sync_t] = None,
    ):
        self.backends = backends
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(
                f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})"
            )
        self.sync_mode = sync_mode


class nixl_agent:
    """A NIXL agent on an :class:`hmc.Engine` (see the module's docs).

    The engine listens on ``$HMC_NIXL_HOST`` (default ``127.0.0.1``): set it to this host's
    address for peers on other hosts.
    """

    def __init__(
        self,
        agent_name: str,
        nixl_conf: Optional[nixl_agent_config] = None,
        instantiate_all: bool = False,
    ):
        if nixl_conf and instantiate_all:
            instantiate_all = False
            logger.warning("Ignoring instantiate_all based on the provided config in agent creation.")
        conf = nixl_conf or nixl_agent_config()
        default_sync = (
            nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen
            else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
        )
        # NIXL's agent core from NIXL's config record: it refuses an empty name and decides
        # telemetry (NIXL_TELEMETRY_ENABLE over capture_telemetry).
        core_conf = nixlBind.nixlAgentConfig()
        core_conf.useProgThread = conf.enable_pthread
        core_conf.useListenThread = conf.enable_listen
        core_conf.listenPort = conf.port
        core_conf.syncMode = (conf.sync_mode or default_sync).value
        core_conf.captureTelemetry = conf.capture_telemetry
        self.agent = nixlBind.nixlAgent(agent_name, core_conf)
        self.name = agent_name
        self._conf = conf
        self._lock = threading.RLock()
        self._engine: Optional[hmc.Engine] = None
        self._transport: Optional[str] = None
        self._etcd = False
        self._regs: dict[tuple[int, int], hmc.MemHandle] = {}
        self._remotes: dict[str, str] = {}  # agent name -> engine address
        self._agents: dict[str, str] = {}  # engine address -> agent name
        self._self_addr: Optional[str] = None  # this agent's engine as its own peer (loopback)
        self._costs: dict[str, list[tuple[int, int]]] = {}  # agent -> (bytes, us) of recent posts
        self.notifs: dict[str, list[bytes]] = {}
        self._fresh: dict[str, list[bytes]] = {}
        self.backends: dict[str, int] = {}
        self.backend_mems: dict[str, list[str]] = {}
        self.backend_options: dict[str, dict[str, str]] = {}
        self.plugin_list = list(self.agent.getAvailPlugins())
        self.nixl_mems = {
            "DRAM": nixlBind.DRAM_SEG,
            "VRAM": nixlBind.VRAM_SEG,
            "FILE": nixlBind.FILE_SEG,
            "BLOCK": nixlBind.BLK_SEG,
            "OBJ": nixlBind.OBJ_SEG,
            "cpu": nixlBind.DRAM_SEG,
            "cuda": nixlBind.VRAM_SEG,
        }
        self.nixl_ops = {"WRITE": nixlBind.NIXL_WRITE, "READ": nixlBind.NIXL_READ}
        for b in self.plugin_list if instantiate_all else conf.backends:
            if b not in self.plugin_list:
                logger.warning("Skipping backend registration %s due to the missing plugin.", b)
            else:
                self.create_backend(b)
        self._listener = None
        if conf.enable_listen and self._engine is not None:
            from ._listen import Listener

            self._listener = Listener(
                os.environ.get("HMC_NIXL_HOST", "127.0.0.1"), conf.port, self.add_remote_agent,
                self.get_agent_metadata, self._drop_remote,
            )
        logger.info("Initialized NIXL agent on hmc: %s", agent_name)

    def __del__(self):
        lis = getattr(self, "_listener", None)
        if lis is not None:
            lis.close()
        e = getattr(self, "_engine", None)
        if e is not None:
            try:
                e.finalize()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ backends

    def get_plugin_list(self) -> list[str]:
        """The backends an agent can create: NIXL's ``UCX`` and hmc's transports."""
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend: str) -> list[str]:
        """The memory types of plugin ``backend``; empty (and a warning) for a name that
        is not a plugin here, as NIXL's."""
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its supported mem types.", backend)
            return []
        return ["DRAM", "VRAM"]

    def get_plugin_params(self, backend: str) -> dict[str, str]:
        """The initialization parameters of plugin ``backend`` (none: hmc's options come
        from ``HMC_CONFIG``); empty (and a warning) for a name that is not a plugin here."""
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its parameters.", backend)
        return {}

    def get_backend_mem_types(self, backend: str) -> list[str]:
        if backend not in self.backend_mems:
            logger.warning("Backend %s not instantiated to get its supported mem types.", backend)
            return []
        return self.backend_mems[backend]

    def get_backend_params(self, backend: str) -> dict[str, str]:
        if backend not in self.backend_options:
            logger.warning("Backend %s not instantiated to get its parameters.", backend)
            return {}
        return self.backend_options[backend]

    def create_backend(self, backend: str, initParams: dict[str, str] = {}):  # noqa: B006, N803
        """Creates ``backend``: the first one chooses the agent's transport; a later one of
        another transport is refused (one transport per agent)."""
        self._check_backend_name(backend)
        with self._lock:
            want = _TRANSPORTS[backend]
            if self._engine is None:
                e = hmc.Engine()
                opts = {} if want == "auto" else {"transport": want}
                opts.update(work_alike_config.load("nixl"))
                kw = {}
                etcd = os.environ.get("NIXL_ETCD_ENDPOINTS")
                if etcd:
                    # NIXL's central metadata server: agents registered in etcd under their
                    # names (in NIXL_ETCD_NAMESPACE, default `nixl`), found by name.
                    hosts = ",".join(h.split("://", 1)[-1].rstrip("/") for h in etcd.split(","))
                    ns = os.environ.get("NIXL_ETCD_NAMESPACE", "nixl").strip("/") or "nixl"
                    kw = {"metadata": f"etcd://{hosts}/{ns}", "name": self.name}
                e.initialize(os.environ.get("HMC_NIXL_HOST", "127.0.0.1") + ":0", opts, **kw)
                self._etcd = bool(kw)
                self._engine, self._transport = e, want
            elif want != self._transport:
                raise nixlBind.nixlNotSupportedError(
                    f"this agent moves bytes over `{self._transport}`; an hmc agent has one "
                    f"transport, so `{backend}` needs an agent of its own"
                )
            self.backends[backend] = len(self.backends) + 1
            self.backend_mems[backend] = ["DRAM", "VRAM"]
            self.backend_options[backend] = dict(initParams)
            # The transport the engine runs (HMC_CONFIG's `transport` may have chosen it),
            # not the choice NIXL's name asked for.
            kind = self._engine.capabilities()["transport"]
            in_use = _TRANSPORT_NAMES.get(kind, kind)
            logger.info("Backend %s was instantiated (hmc transport %s)", backend, in_use)

    def _check_backend_name(self, backend: str):
        if backend in _STORAGE:
            raise NotImplementedError(
                f"NIXL's {backend} backend is not carried by hmc.nixl; use NIXL for storage, "
                "or one of " + ", ".join(self.plugin_list) + " for memory"
            )
        if backend not in _TRANSPORTS:
            raise nixlBind.nixlNotFoundError(
                f"no backend `{backend}`; hmc.nixl has " + ", ".join(self.plugin_list)
            )

    def _e(self) -> hmc.Engine:
        if self._engine is None:
            raise nixlBind.nixlNotAllowedError(
                "this agent has no backend: pass backends=['UCX'] (the default) or call "
                "create_backend"
            )
        return self._engine

    # ------------------------------------------------------------------ memory

    def register_memory(self, reg_list, mem_type: Optional[str] = None, backends: list[str] = []):  # noqa: B006
        """Registers each region of ``reg_list`` (tuples, an N x 3 array, tensors or an
        ``nixlRegDList``); returns the ``nixlRegDList``."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlBind.nixlInvalidParamError("register_memory: no descriptors could be made of the input")
        self._check_kind(descs, "register_memory")
        vram = descs.getType() == nixlBind.VRAM_SEG
        e = self._e()
        done = []
        try:
            with self._lock:
                for addr, length, dev, _meta in descs:
                    if vram:
                        # CUDA memory of device ``dev``: over tcp the engine serves peers'
                        # READs and WRITEs of it through its pinned host chunks.
                        h = e.register_mem((addr, length), hmc.MemType.DEVICE, f"cuda:{int(dev)}")
                    else:
                        h = e.register_mem((addr, length))
                    self._regs[(addr, length)] = h
                    done.append((addr, length))
        except hmc.HmcError as err:
            for k in done:
                e.deregister_mem(self._regs.pop(k))
            raise _nixl_error(err) from err
        return descs

    def deregister_memory(self, dereg_list, backends: list[str] = []):  # noqa: B006
        descs = self.get_reg_descs(dereg_list)
        with self._lock:
            keys = [(a, n) for a, n, _d, _m in descs]
            missing = [k for k in keys if k not in self._regs]
            if missing:
                raise nixlBind.nixlNotFoundError(
                    f"deregister_memory: {hex(missing[0][0])} ({missing[0][1]} bytes) is not registered"
                )
            for k in keys:
                try:
                    self._e().deregister_mem(self._regs.pop(k))
                except hmc.HmcError as err:
                    raise _nixl_error(err) from err

    def query_memory(self, reg_list, backend: str, mem_type: Optional[str] = None):
        """As NIXL's memory backends: not supported (it queries storage)."""
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends.keys())}")
        raise nixlBind.nixlNotSupportedError("NIXL_ERR_NOT_SUPPORTED: query_memory is for storage backends")

    def _check_kind(self, descs, call: str):
        """DRAM and VRAM (CUDA) are carried; storage segments (FILE, BLK, OBJ) are not."""
        if descs.getType() not in (nixlBind.DRAM_SEG, nixlBind.VRAM_SEG):
            raise NotImplementedError(
                f"{call}: {descs.getType().name} memory is not carried by hmc.nixl (it has no "
                "storage backends); use DRAM or VRAM"
            )

    # ------------------------------------------------------------------ connections and lists

    def make_connection(self, remote_agent: str, backends: list[str] = []):  # noqa: B006
        """Connected already by ``add_remote_agent``: checks that the agent is known."""
        self._addr(remote_agent)

    def _known(self, name: str) -> Optional[str]:
        """The engine address of agent `name` (this agent's own: its loopback), if loaded."""
        if name == self.name and self._engine is not None:
            return self._loopback()
        with self._lock:
            return self._remotes.get(name)

    def _addr(self, agent) -> str:
        name = _name(agent)
        addr = self._known(name)
        if addr is None:
            raise nixlBind.nixlNotFoundError(f"NIXL_ERR_NOT_FOUND: metadata for remote agent '{name}' not found")
        return addr

    def _loopback(self) -> str:
        """This agent's own engine as a peer: NIXL's loopback (the agent's own name as the
        remote side), the same path a remote agent's transfers take."""
        with self._lock:
            if self._self_addr is None:
                e = self._e()
                try:
                    self._self_addr = e.add_remote(e.local_metadata(), _TIMEOUT_MS)
                except hmc.HmcError as err:
                    raise _nixl_error(err) from err
                self._agents[self._self_addr] = self.name
            return self._self_addr

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type: Optional[str] = None, backends: list[str] = []):  # noqa: B006
        """Prepares a descriptor list: local for ``"NIXL_INIT_AGENT"`` (or ``""``), else of
        the remote agent ``agent_name`` (this agent's own name: its own registered memory as
        the remote side, for a loopback transfer). An N x 5 array is strided entries (addr,
        len, dev, stride, count) and needs ``mem_type``."""
        strided = isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2 and xfer_list.shape[1] == 5
        if strided:
            if mem_type is None:
                raise ValueError("Please specify a mem type for strided descriptors")
            if self.nixl_mems[mem_type] not in (nixlBind.DRAM_SEG, nixlBind.VRAM_SEG):
                raise NotImplementedError(f"prep_xfer_dlist: {mem_type} memory is not carried by hmc.nixl; use DRAM or VRAM")
            entries = np.ascontiguousarray(xfer_list, dtype=np.uint64)
        else:
            descs = self.get_xfer_descs(xfer_list, mem_type)
            if descs is None:
                raise nixlBind.nixlInvalidParamError("prep_xfer_dlist: no descriptors could be made of the input")
            self._check_kind(descs, "prep_xfer_dlist")
            entries = descs._array()
        name = _name(agent_name)
        e = self._e()
        try:
            if name in ("", "NIXL_INIT_AGENT"):
                return nixl_prepped_dlist_handle(self, e.prepare_local(entries), None)
            return nixl_prepped_dlist_handle(self, e.prepare_remote(self._addr(name), entries, _TIMEOUT_MS), name)
        except hmc.HmcError as err:
            raise _nixl_error(err) from err

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle):
        handle.release()

    # ------------------------------------------------------------------ transfers

    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: nixl_prepped_dlist_handle,
        local_indices: Union[list[int], np.ndarray],
        remote_xfer_side: nixl_prepped_dlist_handle,
        remote_indices: Union[list[int], np.ndarray],
        notif_msg: bytes = b"",
        backends: list[str] = [],  # noqa: B006
        skip_desc_merge: bool = False,
    ) -> nixl_xfer_handle:
        """A transfer of the indexed entries of two prepared lists; ``notif_msg`` (when not
        empty) reaches the remote agent once the bytes are there."""
        # An unknown operation is a KeyError before anything else, as NIXL's.
        op = _OPS[self.nixl_ops[operation]]
        local, remote = local_xfer_side._live(), remote_xfer_side._live()
        if local_xfer_side._remote is not None or remote_xfer_side._remote is None:
            raise nixlBind.nixlInvalidParamError(
                "make_prepped_xfer: the local side must be prepared with NIXL_INIT_AGENT and the "
                "remote side with a remote agent's name"
            )
        e = self._e()
        li, ri = np.asarray(local_indices, dtype=np.int64), np.asarray(remote_indices, dtype=np.int64)

        def make(msg: bytes):
            try:
                if msg:
                    return e.make_transfer(op, local, li, remote, ri, notif_msg=bytes(msg), notif_name=self.name)
                return e.make_transfer(op, local, li, remote, ri)
            except hmc.HmcError as err:
                raise _nixl_error(err) from err

        handle = nixl_xfer_handle(self, make, _bytes(notif_msg), remote_xfer_side._remote)
        # NIXL merges a prepared transfer's adjacent descriptors unless told not to, and
        # its telemetry counts them merged (the engine's count, then); as given otherwise.
        handle._count = len(li) if skip_desc_merge else 0
        return handle

    def initialize_xfer(
        self,
        operation: str,
        local_descs,
        remote_descs,
        remote_agent: str,
        notif_msg: bytes = b"",
        backends: list[str] = [],  # noqa: B006
    ) -> nixl_xfer_handle:
        """A transfer of two descriptor lists, prepared for it."""
        self.nixl_ops[operation]  # an unknown operation is a KeyError first, as NIXL's
        lh = self.prep_xfer_dlist("NIXL_INIT_AGENT", local_descs)
        rh = self.prep_xfer_dlist(remote_agent, remote_descs)
        n = len(lh._list)
        if n != len(rh._list):
            raise nixlBind.nixlInvalidParamError("initialize_xfer: the two lists differ in length")
        idx = np.arange(n, dtype=np.int64)
        handle = self.make_prepped_xfer(operation, lh, idx, rh, idx, notif_msg)
        handle._count = n  # NIXL counts an initialize_xfer request's descriptors as given
        return handle

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        """Posts the transfer; ``"DONE"``, ``"PROC"`` or ``"ERR"``. A ``notif_msg`` given here
        replaces the handle's for this and later posts."""
        x = handle._live()
        msg = _bytes(notif_msg)
        if handle._posted and not x.done():
            raise nixlBind.nixlRepostActiveError("NIXL_ERR_REPOST_ACTIVE: the transfer is still in progress")
        if msg and msg != handle._notif:
            x.release()
            handle._xfer, handle._notif = handle._make(msg), msg
            x = handle._xfer
        t0 = time.perf_counter()
        handle._post_at_us, handle._done_at_us = int(time.time() * 1e6), 0
        try:
            x.post()
        except hmc.StateError as err:
            raise nixlBind.nixlRepostActiveError(f"NIXL_ERR_REPOST_ACTIVE: {err}") from err
        except hmc.HmcError as err:
            raise _nixl_error(err) from err
        handle._post_us = int((time.perf_counter() - t0) * 1e6)
        handle._posted, handle._sampled = True, False
        return self.check_xfer_state(handle)

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """``"DONE"``, ``"PROC"`` or ``"ERR"``; a peer that went away raises
        ``nixlRemoteDisconnectError``, as NIXL's does."""
        x = handle._live()
        s = x.status()
        if s == hmc.TransferStatus.COMPLETED:
            if not handle._sampled:
                handle._done_at_us = int(time.time() * 1e6)
                handle._sampled = True
                t = x.telemetry()
                if t is not None:
                    # What get_xfer_telemetry reports as the transfer's time.
                    self._learn_cost(handle._remote, int(t["bytes"]), handle._done_at_us - handle._post_at_us)
            return "DONE"
        if s == hmc.TransferStatus.WAITING:
            # NIXL's check_xfer_state drives the transfer (UCX progress runs in the calling
            # thread); here the engine's threads move the bytes, and a caller spinning on
            # the handle takes the CPU they need. A poll that follows the last one of this
            # handle closely is such a spin: it waits for the completion instead, with the
            # GIL released, for at most _SPIN_WAIT_MS (it returns as soon as the transfer
            # ends). A loop that polls many handles once per step never waits here.
            now = time.perf_counter_ns()
            spinning = now - handle._polled_ns < _SPIN_GAP_NS
            handle._polled_ns = now
            if not spinning:
                return "PROC"
            s = x.wait(_SPIN_WAIT_MS)
            if s == hmc.TransferStatus.WAITING:
                return "PROC"
            return self.check_xfer_state(handle)
        err = x.error()
        if isinstance(err, hmc.PeerGoneError) or (isinstance(err, hmc.UnavailableError) and "gone" in str(err).lower()):
            raise nixlBind.nixlRemoteDisconnectError(f"NIXL_ERR_REMOTE_DISCONNECT: {err}")
        logger.error("transfer failed: %s", err)
        return "ERR"

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlBind.nixlXferTelemetry:
        if not self.agent.telemetry:
            raise nixlBind.nixlNoTelemetryError(
                "NIXL_ERR_NO_TELEMETRY: create the agent with nixl_agent_config(capture_telemetry=True) "
                "or set NIXL_TELEMETRY_ENABLE=y (NIXL_TELEMETRY_ENABLE=n turns it off over the config)"
            )
        t = handle._live().telemetry()
        if t is None:
            raise nixlBind.nixlNotPostedError("NIXL_ERR_NOT_POSTED: the transfer has not ended a post yet")
        # NIXL's times run from the start of the post call to the status call that saw
        # the transfer done (so the transfer's time covers the post's).
        start = handle._post_at_us or int(t["posted_at"] * 1e6)
        seen = handle._done_at_us or int(t["posted_at"] * 1e6) + int(t["duration_us"])
        return nixlBind.nixlXferTelemetry(
            startTime=start,
            postDuration=handle._post_us,
            xferDuration=seen - start,
            totalBytes=t["bytes"],
            descCount=handle._count or t["descs"],
        )

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        handle._live()
        return next(iter(self.backends))

    def _learn_cost(self, remote: str, nbytes: int, us: int) -> None:
        with self._lock:
            seen = self._costs.setdefault(remote, [])
            seen.append((nbytes, us))
            del seen[:-_COST_SAMPLES]

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> tuple[int, int, str]:
        """``(duration_us, err_margin_us, method)`` of the request. NIXL asks its backend's
        analytical model; hmc's transports have none, so the estimate is this agent's own
        record: a line ``fixed + bytes / rate`` fitted to its last completed posts with the
        same remote agent, the error margin their mean distance from it. ``(0, 0,
        "UNKNOWN")`` before any post to that agent has completed (NIXL's answer where its
        backend cannot estimate); the method is ``"UNKNOWN"`` as NIXL 1.5.1's Python API
        reports for every backend."""
        x = req_handle._live()
        with self._lock:
            seen = list(self._costs.get(req_handle._remote, ()))
        if not seen:
            return 0, 0, "UNKNOWN"
        fixed, per_byte = _fit_line(seen)
        margin = sum(abs(us - (fixed + per_byte * b)) for b, us in seen) / len(seen)
        return max(0, round(fixed + per_byte * x.bytes)), round(margin), "UNKNOWN"

    def release_xfer_handle(self, handle: nixl_xfer_handle):
        """Releases the handle; a transfer in flight is cancelled first."""
        handle.release()

    def prep_mem_view(self, dlist, *, backends: Optional[list[str]] = None) -> int:
        raise NotImplementedError("prep_mem_view (NIXL's device-side API) is not carried by hmc.nixl")

    def release_mem_view(self, mvh: int) -> None:
        raise NotImplementedError("release_mem_view (NIXL's device-side API) is not carried by hmc.nixl")

    # ------------------------------------------------------------------ notifications

    def _poll(self) -> None:
        for frm, name, msg, failed in self._e().get_notifications():
            if failed is not None:
                logger.warning("a transfer from %s failed (its notification is not delivered): %s", name or frm, failed)
                continue
            agent = name or self._agents.get(frm, frm)
            self._fresh.setdefault(agent, []).append(bytes(msg))

    def get_new_notifs(self, backends: list[str] = []) -> dict[str, list[bytes]]:  # noqa: B006
        """Notifications since the last call, by sending agent."""
        with self._lock:
            self._poll()
            out, self._fresh = self._fresh, {}
            return out

    def update_notifs(self, backends: list[str] = []) -> dict[str, list[bytes]]:  # noqa: B006
        """Adds new notifications to ``self.notifs`` and returns it."""
        with self._lock:
            for agent, msgs in self.get_new_notifs().items():
                self.notifs.setdefault(agent, []).extend(msgs)
            return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes, backends: list[str] = [], tag_is_prefix=True) -> bool:  # noqa: B006
        with self._lock:
            self.update_notifs()
            msgs = self.notifs.get(_name(remote_agent_name), [])
            for m in msgs:
                if (tag_is_prefix and m.startswith(lookup_tag)) or (not tag_is_prefix and lookup_tag in m):
                    msgs.remove(m)
                    return True
            return False

    def send_notif(self, remote_agent_name: str, notif_msg: bytes, backend: Optional[str] = None):
        """A standalone notification to a remote agent."""
        try:
            self._e().send_notify(self._addr(remote_agent_name), _bytes(notif_msg), _TIMEOUT_MS, name=self.name)
        except hmc.HmcError as err:
            raise _nixl_error(err) from err

    # ------------------------------------------------------------------ metadata

    def _wrap(self, blob: bytes) -> bytes:
        n = self.name.encode()
        return _MAGIC + struct.pack(">H", len(n)) + n + blob

    def get_agent_metadata(self) -> bytes:
        """This agent's metadata: its name and its engine's blob."""
        return self._wrap(self._e().local_metadata())

    def get_partial_agent_metadata(self, descs, inc_conn_info: bool = False, backends: list[str] = []) -> bytes:  # noqa: B006
        """Metadata of the registered regions ``descs`` (with connection information always:
        ``inc_conn_info`` is accepted)."""
        rows = self.get_reg_descs(descs) if not isinstance(descs, nixlBind.nixlRegDList) else descs
        with self._lock:
            try:
                handles = [self._regs[(a, n)] for a, n, _d, _m in rows]
            except KeyError as k:
                raise nixlBind.nixlNotFoundError(f"get_partial_agent_metadata: {k} is not registered") from None
        return self._wrap(self._e().partial_metadata(handles))

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Loads a remote hmc agent's metadata; returns its name (bytes, as NIXL's)."""
        metadata = bytes(metadata)
        if not metadata.startswith(_MAGIC):
            raise nixlBind.nixlMismatchError(
                "NIXL_ERR_MISMATCH: not an hmc.nixl agent's metadata (an hmc agent talks to hmc "
                "agents only, not to NIXL processes)"
            )
        at = len(_MAGIC) + 2
        (n,) = struct.unpack(">H", metadata[len(_MAGIC) : at]) if len(metadata) >= at else (1 << 16,)
        if len(metadata) < at + n:
            raise nixlBind.nixlMismatchError(
                f"NIXL_ERR_MISMATCH: the metadata is truncated ({len(metadata)} bytes): pass the "
                "whole of the peer's get_agent_metadata()"
            )
        try:
            name = metadata[at : at + n].decode()
        except UnicodeDecodeError:
            raise nixlBind.nixlMismatchError("NIXL_ERR_MISMATCH: the metadata's agent name is not UTF-8") from None
        blob = metadata[at + n :]
        try:
            addr = self._e().add_remote(blob, _TIMEOUT_MS)
        except hmc.HmcError as err:
            raise _nixl_error(err) from err
        with self._lock:
            self._remotes[name] = addr
            self._agents[addr] = name
        return name.encode()

    def remove_remote_agent(self, agent: str):
        addr = self._addr(agent)
        with self._lock:
            self._remotes.pop(_name(agent), None)
            self._agents.pop(addr, None)
            if addr == self._self_addr:
                self._self_addr = None
        try:
            self._e().remove_remote(addr)
        except hmc.HmcError as err:
            raise _nixl_error(err) from err

    def check_remote_metadata(self, agent: str, descs=None) -> bool:
        """Whether the agent's metadata is loaded (and, with ``descs``, covers them)."""
        addr = self._known(_name(agent))
        if addr is None or not self._e().check_remote(addr):
            return False
        if descs is None or len(descs) == 0:
            return True
        try:
            self._e().prepare_remote(addr, self.get_xfer_descs(descs)._array(), _TIMEOUT_MS)
            return True
        except hmc.HmcError:
            return False

    def _no_exchange(self, call: str):
        raise NotImplementedError(
            f"{call} without ip_addr needs a central metadata server: set NIXL_ETCD_ENDPOINTS "
            "(etcd), give the peer's ip_addr and port (its listen thread), or pass "
            "get_agent_metadata() over your own side channel"
        )

    def _drop_remote(self, name: str) -> None:
        if name in self._remotes:
            self.remove_remote_agent(name)

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT):
        """Sends this agent's metadata to the listen thread of the peer at ``ip_addr:port``
        (done when this returns); without ``ip_addr``, to the central metadata server (with
        ``NIXL_ETCD_ENDPOINTS`` the agent is registered there from its start; this lists it
        again after ``invalidate_local_metadata``)."""
        if not ip_addr:
            if not self._etcd:
                self._no_exchange("send_local_metadata")
            # Registered in etcd from the start; listed again after invalidate_local_metadata.
            try:
                return self._e().set_listed(True)
            except hmc.HmcError as err:
                raise _nixl_error(err) from err
        from . import _listen

        _listen.exchange(ip_addr, port, b"S", self.get_agent_metadata(), False)

    def send_partial_agent_metadata(self, descs, inc_conn_info: bool = False, backends: list[str] = [], ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = ""):  # noqa: B006
        """Sends the metadata of the registered ``descs`` to the peer at ``ip_addr:port``;
        without ``ip_addr``, publishes it in etcd under ``label`` (needed there) for a peer's
        ``fetch_remote_metadata(name, label=label)``."""
        if not ip_addr:
            if not self._etcd:
                self._no_exchange("send_partial_agent_metadata")
            if not label:
                raise nixlBind.nixlInvalidParamError(
                    "NIXL_ERR_INVALID_PARAM: partial metadata sent to etcd needs a label"
                )
            try:
                return self._e().publish_label(label, self.get_partial_agent_metadata(descs, inc_conn_info))
            except hmc.HmcError as err:
                raise _nixl_error(err) from err
        from . import _listen

        _listen.exchange(ip_addr, port, b"S", self.get_partial_agent_metadata(descs, inc_conn_info), False)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = ""):
        """Fetches the metadata of the agent listening at ``ip_addr:port`` and loads it (done
        when this returns; an agent of another name there is refused)."""
        if not ip_addr:
            if self._etcd:
                return self._fetch_from_etcd(_name(remote_agent), label)
            self._no_exchange("fetch_remote_metadata")
        from . import _listen

        md = _listen.exchange(ip_addr, port, b"F", _name(remote_agent).encode(), True)
        got = self.add_remote_agent(md).decode()
        if got != _name(remote_agent):
            self.remove_remote_agent(got)
            raise nixlBind.nixlMismatchError(
                f"NIXL_ERR_MISMATCH: the agent at {ip_addr}:{port} is `{got}`, not `{_name(remote_agent)}`"
            )

    def _fetch_from_etcd(self, name: str, label: str = "") -> None:
        """Connects to ``name`` through etcd in the background, retrying until it is
        registered (NIXL's watch), for up to ``HMC_NIXL_FETCH_TIMEOUT_MS`` (default 60 s);
        with a ``label``, loads the partial metadata it published under it once there.
        ``check_remote_metadata`` is true once done."""
        budget = int(os.environ.get("HMC_NIXL_FETCH_TIMEOUT_MS", "60000")) / 1000

        def once():
            if not label:
                if not self._e().check_remote(name):
                    self._e().connect(name, _TIMEOUT_MS)
                with self._lock:
                    self._remotes[name] = name
                    self._agents[name] = name
                return True
            blob = self._e().fetch_label(name, label, _TIMEOUT_MS)
            if blob is None:
                return False
            self.add_remote_agent(blob)
            return True

        def fetch():
            end, last = time.monotonic() + budget, "not registered"
            while time.monotonic() < end:
                try:
                    if once():
                        return
                except Exception as err:  # noqa: BLE001 (kept for the log line)
                    last = err
                time.sleep(0.05)
            what = f"label `{label}` of {name}" if label else name
            logger.error("fetch_remote_metadata(%s): not found in etcd: %s", what, last)

        threading.Thread(target=fetch, name=f"hmc-nixl-fetch-{name}", daemon=True).start()

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT):
        """Tells the peer at ``ip_addr:port`` to drop this agent's metadata; without
        ``ip_addr``, takes the agent out of etcd (its peers there drop it, as for one that
        left; ``send_local_metadata()`` lists it again). The agent keeps working."""
        if not ip_addr:
            if not self._etcd:
                self._no_exchange("invalidate_local_metadata")
            try:
                return self._e().set_listed(False)
            except hmc.HmcError as err:
                raise _nixl_error(err) from err
        from . import _listen

        _listen.exchange(ip_addr, port, b"I", self.name.encode(), False)

    # ------------------------------------------------------------------ descriptor lists

    @staticmethod
    def _tensor_mem_type(tensor) -> str:
        return "DRAM" if tensor.get_device() == -1 else "VRAM"

    def _tensor_rows(self, tensors):
        rows = []
        for t in tensors:
            if not t.is_contiguous():
                logger.error("Please use a list of contiguous Tensors")
                return None, None
            dev = t.get_device()
            rows.append((t.data_ptr(), t.numel() * t.element_size(), 0 if dev == -1 else dev))
        return rows, self._tensor_mem_type(tensors[0])

    def get_xfer_descs(self, descs, mem_type: Optional[str] = None):
        """An ``nixlXferDList`` from 3-tuples or an N x 3 array with ``mem_type``, a tensor
        or a list of tensors, or a list as is."""
        if isinstance(descs, nixlBind.nixlXferDList):
            return descs
        if isinstance(descs, nixlBind.nixlRegDList):
            logger.error("RegList type detected for transfer, please use XferList")
            return None
        if _is_torch_tensor(descs):
            descs = [descs]
        if isinstance(descs, np.ndarray) or (len(descs) and isinstance(descs[0], tuple)):
            if mem_type is None:
                logger.error("Please specify a mem type if not using Tensors")
                return None
            return nixlBind.nixlXferDList(self.nixl_mems[mem_type], descs)
        if len(descs) and _is_torch_tensor(descs[0]):
            rows, mt = self._tensor_rows(descs)
            return None if rows is None else nixlBind.nixlXferDList(self.nixl_mems[mt], rows)
        return None

    def get_remote_descs(self, descs, mem_type: Optional[str] = None):
        if isinstance(descs, nixlBind.nixlRemoteDList):
            return descs
        if len(descs) and isinstance(descs[0], tuple) and mem_type is not None:
            return nixlBind.nixlRemoteDList(self.nixl_mems[mem_type], descs)
        logger.error("4-tuple list (addr, len, dev_id, agent_name) and a mem type needed for remote descriptors")
        return None

    def get_reg_descs(self, descs, mem_type: Optional[str] = None):
        """An ``nixlRegDList`` from 4-tuples or an N x 3 array with ``mem_type``, a tensor or a
        list of tensors, or a list as is."""
        if isinstance(descs, nixlBind.nixlRegDList):
            return descs
        if isinstance(descs, nixlBind.nixlXferDList):
            logger.error("XferList type detected for registration, please use RegList")
            return None
        if _is_torch_tensor(descs):
            descs = [descs]
        if isinstance(descs, np.ndarray) or (len(descs) and isinstance(descs[0], tuple)):
            if mem_type is None:
                logger.error("Please specify a mem type if not using Tensors")
                return None
            return nixlBind.nixlRegDList(self.nixl_mems[mem_type], descs)
        if len(descs) and _is_torch_tensor(descs[0]):
            rows, mt = self._tensor_rows(descs)
            return None if rows is None else nixlBind.nixlRegDList(self.nixl_mems[mt], [r + ("",) for r in rows])
        return None

    def get_serialized_descs(self, descs) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes):
        return pickle.loads(serialized_descs)  # noqa: S301 (NIXL's API: the caller's bytes)


def _fit_line(samples: list[tuple[int, int]]) -> tuple[float, float]:
    """``(fixed_us, us_per_byte)`` of the least-squares line through ``(bytes, us)``
    samples; a line through the origin when their sizes do not differ (or the fit would
    have a negative slope)."""
    n = len(samples)
    mb = sum(b for b, _ in samples) / n
    mu = sum(us for _, us in samples) / n
    var = sum((b - mb) ** 2 for b, _ in samples)
    if var > 0:
        slope = sum((b - mb) * (us - mu) for b, us in samples) / var
        if slope >= 0:
            return max(0.0, mu - slope * mb), slope
    total = sum(b for b, _ in samples)
    return 0.0, (sum(us for _, us in samples) / total if total else 0.0)


def _bytes(msg) -> bytes:
    return msg.encode() if isinstance(msg, str) else bytes(msg)
