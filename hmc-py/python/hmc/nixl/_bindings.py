"""``nixl._bindings``: NIXL's status codes, memory types, operations and exceptions with
NIXL's names and values, and its descriptor lists and telemetry record, in Python."""

import os
from enum import IntEnum

import numpy as np

from .logging import get_logger

_log = get_logger(__name__)


class nixl_status_t(IntEnum):
    NIXL_SUCCESS = 0
    NIXL_IN_PROG = 1
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9


class nixl_mem_t(IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_xfer_op_t(IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_thread_sync_t(IntEnum):
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_cost_t(IntEnum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


globals().update({m.name: m for e in (nixl_status_t, nixl_mem_t, nixl_xfer_op_t, nixl_cost_t) for m in e})
NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT

NIXL_INIT_AGENT = ""
DEFAULT_COMM_PORT = 8888
# No device-side API: `prep_mem_view` is not carried.
HAVE_UCX_GPU_DEVICE_API = 0


class nixlBackendError(Exception):
    pass


class nixlCancelledError(Exception):
    pass


class nixlInvalidParamError(Exception):
    pass


class nixlMismatchError(Exception):
    pass


class nixlNoTelemetryError(Exception):
    pass


class nixlNotAllowedError(Exception):
    pass


class nixlNotFoundError(Exception):
    pass


class nixlNotPostedError(Exception):
    pass


class nixlNotSupportedError(Exception):
    pass


class nixlRemoteDisconnectError(Exception):
    pass


class nixlRepostActiveError(Exception):
    pass


class nixlUnknownError(Exception):
    pass


class _DList:
    """A descriptor list of one memory type: rows of (addr, len, dev_id) and, per kind,
    one more column (registration: meta info; remote: the agent's name).

    Built from an N x 3 array (the common way for large lists), it keeps that array as
    ``uint64`` and nothing per row: 24 bytes a descriptor, and no Python object per row
    until one is asked for. Built or changed row by row, it keeps a list of tuples; each
    form is made from the other when a call needs it."""

    _extra = None  # the name of the fourth column, if the kind has one

    def __init__(self, type, descs=None, sorted=False):  # noqa: A002 (NIXL's names)
        self._type = nixl_mem_t(int(type))
        self._rows: list | None = []
        self._arr: np.ndarray | None = None
        if descs is None:
            return
        if isinstance(descs, np.ndarray):
            if descs.ndim != 2 or descs.shape[1] != 3:
                raise nixlInvalidParamError("an N x 3 array (addr, len, dev_id) is needed")
            if descs.dtype.kind not in "iu":
                raise nixlInvalidParamError(
                    f"an N x 3 array of integers (addr, len, dev_id) is needed, not {descs.dtype}"
                )
            if descs.dtype.kind == "i" and descs.size and int(descs.min()) < 0:
                raise nixlInvalidParamError("a descriptor's addr, len and dev_id are not negative")
            self._arr = np.ascontiguousarray(descs, dtype=np.uint64)
            self._rows = None
        else:
            for d in descs:
                self.addDesc(d)

    def _row(self, d):
        d = tuple(d)
        want = 4 if self._extra else 3
        if len(d) != want:
            raise nixlInvalidParamError(
                f"a {type(self).__name__} descriptor is a {want}-tuple (addr, len, dev_id"
                + (f", {self._extra})" if self._extra else ")")
            )
        return (int(d[0]), int(d[1]), int(d[2])) + ((str(d[3]),) if self._extra else ())

    def _list(self) -> list:
        """The rows as tuples (made from the array once; the array is dropped, as the
        caller is about to change or walk the rows)."""
        if self._rows is None:
            fill = ("",) if self._extra else ()
            self._rows = [(a, n, d) + fill for a, n, d in self._arr.tolist()]
            self._arr = None
        return self._rows

    def getType(self):
        return self._type

    def descCount(self) -> int:
        return len(self)

    def isEmpty(self) -> bool:
        return len(self) == 0

    def addDesc(self, desc) -> None:
        self._list().append(self._row(desc))

    def append(self, desc) -> None:
        self.addDesc(desc)

    def remDesc(self, index: int) -> None:
        del self._list()[index]

    def clear(self) -> None:
        self._rows, self._arr = [], None

    def index(self, desc) -> int:
        try:
            return self._list().index(self._row(desc))
        except ValueError:
            return int(nixl_status_t.NIXL_ERR_NOT_FOUND)

    def print(self) -> None:
        print(self)

    def __getitem__(self, i):
        if self._rows is None:
            a, n, d = self._arr[i].tolist()
            return (a, n, d) + (("",) if self._extra else ())
        return self._rows[i]

    def __setitem__(self, i, desc):
        self._list()[i] = self._row(desc)

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else int(self._arr.shape[0])

    def __iter__(self):
        return iter(self._list()) if self._rows is not None else (self[i] for i in range(len(self)))

    def __eq__(self, other):
        if type(other) is not type(self) or self._type != other._type or len(self) != len(other):
            return False
        if self._extra is None:
            return bool(np.array_equal(self._array(), other._array()))
        return list(self) == list(other)

    def __getstate__(self):
        return {"_type": self._type, "_rows": self._rows, "_arr": self._arr}

    def __setstate__(self, state):
        self._type, self._rows, self._arr = state["_type"], state["_rows"], state["_arr"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type.name}, {len(self)} descriptors)"

    def _array(self) -> np.ndarray:
        """The rows as an N x 3 uint64 array (addr, len, dev_id): the list's own array when
        it was built from one (not a copy: do not change it)."""
        if self._rows is None:
            return self._arr
        return np.array([r[:3] for r in self._rows], dtype=np.uint64).reshape(-1, 3)


class nixlXferDList(_DList):
    """Transfer descriptors: (addr, len, dev_id)."""


class nixlRegDList(_DList):
    """Registration descriptors: (addr, len, dev_id, meta info)."""

    _extra = "meta info"

    def trim(self) -> nixlXferDList:
        """The same regions as transfer descriptors (meta info dropped)."""
        return nixlXferDList(self._type, self._array().copy())


class nixlRemoteDList(_DList):
    """Descriptors of a remote agent's memory: (addr, len, dev_id, agent name)."""

    _extra = "agent name"


class nixlXferTelemetry:
    """A transfer's telemetry: ``startTime``, ``postDuration``, ``xferDuration`` (µs),
    ``totalBytes`` and ``descCount`` (descriptors after merging)."""

    def __init__(self, startTime=0, postDuration=0, xferDuration=0, totalBytes=0, descCount=0):
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self) -> str:
        return (
            f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
            f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, "
            f"descCount={self.descCount})"
        )


# NIXL_TELEMETRY_ENABLE's words, as NIXL's configuration reads a boolean (case-insensitive).
_TRUE_WORDS = ("y", "yes", "on", "1", "true", "enable")
_FALSE_WORDS = ("n", "no", "off", "0", "false", "disable")


def _env_bool(name: str):
    """``True``/``False`` for a set variable in NIXL's words, ``None`` when unset; another
    value raises ``RuntimeError`` naming both lists, as NIXL's agent does."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    if raw.lower() in _TRUE_WORDS:
        return True
    if raw.lower() in _FALSE_WORDS:
        return False
    raise RuntimeError(
        f"Conversion to bool failed for string '{raw}' ({name}): known are "
        f"{', '.join(_TRUE_WORDS)} as positive and {', '.join(_FALSE_WORDS)} as negative "
        "(case insensitive)"
    )


class nixlAgentConfig:
    """NIXL's agent configuration record, which ``nixl_agent`` fills from its
    ``nixl_agent_config`` and passes to :class:`nixlAgent` (the fields keep NIXL's names)."""

    def __init__(self, useProgThread=True, useListenThread=False, listenPort=0,  # noqa: N803
                 syncMode=NIXL_THREAD_SYNC_DEFAULT, captureTelemetry=False, pthrDelay=0,  # noqa: N803
                 lthrDelay=100000):  # noqa: N803
        self.useProgThread = useProgThread
        self.useListenThread = useListenThread
        self.listenPort = listenPort
        self.syncMode = syncMode
        self.captureTelemetry = captureTelemetry
        self.pthrDelay = pthrDelay
        self.lthrDelay = lthrDelay


class nixlAgent:
    """The agent core ``nixl_agent`` wraps, as NIXL's binding of the same name: it checks the
    name, decides telemetry and lists the plugins; the engine, memory and transfers live in
    ``nixl_agent`` (an :class:`hmc.Engine`). NIXL's other C++ methods are not carried: each
    raises ``NotImplementedError`` naming the ``nixl_agent`` call to use."""

    def __init__(self, name: str, config: nixlAgentConfig):
        if not isinstance(name, str) or not name:
            # NIXL's agent throws std::invalid_argument, which pybind11 makes a ValueError.
            raise ValueError("Agent needs a non-empty name")
        self.name = name
        self.config = config
        enabled = _env_bool("NIXL_TELEMETRY_ENABLE")
        if enabled is None:
            self.telemetry = bool(config.captureTelemetry)
        else:
            # The variable wins over the agent's config, both ways (NIXL's rule).
            self.telemetry = enabled
            if not enabled and config.captureTelemetry:
                _log.warning(
                    "NIXL telemetry is disabled (NIXL_TELEMETRY_ENABLE); ignoring telemetry "
                    "requested through agent config"
                )

    def getAvailPlugins(self) -> list:  # noqa: N802 (NIXL's name)
        """The backends an hmc agent can create: NIXL's ``UCX`` and hmc's transports."""
        return list(AVAILABLE_PLUGINS)

    def __getattr__(self, attr: str):
        raise NotImplementedError(
            f"nixlAgent.{attr} (NIXL's C++ agent binding) is not carried by hmc.nixl; use the "
            "same call of hmc.nixl._api.nixl_agent"
        )


# The backends an hmc agent can create: NIXL's name for its default, then hmc's transports.
AVAILABLE_PLUGINS = ("UCX", "auto", "tcp", "shm", "ucx", "rdma")
