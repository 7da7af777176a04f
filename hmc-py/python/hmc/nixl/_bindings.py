"""``nixl._bindings``: NIXL's status codes, memory types, operations and exceptions with
NIXL's names and values, and its descriptor lists and telemetry record, in Python."""

from enum import IntEnum

import numpy as np


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
    one more column (registration: meta info; remote: the agent's name)."""

    _extra = None  # the name of the fourth column, if the kind has one

    def __init__(self, type, descs=None, sorted=False):  # noqa: A002 (NIXL's names)
        self._type = nixl_mem_t(int(type))
        self._rows: list[tuple] = []
        if descs is None:
            return
        if isinstance(descs, np.ndarray):
            if descs.ndim != 2 or descs.shape[1] != 3:
                raise nixlInvalidParamError("an N x 3 array (addr, len, dev_id) is needed")
            fill = ("",) if self._extra else ()
            self._rows = [(int(a), int(n), int(d)) + fill for a, n, d in descs.tolist()]
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

    def getType(self):
        return self._type

    def descCount(self) -> int:
        return len(self._rows)

    def isEmpty(self) -> bool:
        return not self._rows

    def addDesc(self, desc) -> None:
        self._rows.append(self._row(desc))

    def append(self, desc) -> None:
        self.addDesc(desc)

    def remDesc(self, index: int) -> None:
        del self._rows[index]

    def clear(self) -> None:
        self._rows.clear()

    def index(self, desc) -> int:
        try:
            return self._rows.index(self._row(desc))
        except ValueError:
            return int(nixl_status_t.NIXL_ERR_NOT_FOUND)

    def print(self) -> None:
        print(self)

    def __getitem__(self, i):
        return self._rows[i]

    def __setitem__(self, i, desc):
        self._rows[i] = self._row(desc)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows)

    def __eq__(self, other):
        return type(other) is type(self) and (self._type, self._rows) == (other._type, other._rows)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type.name}, {len(self._rows)} descriptors)"

    def _array(self) -> np.ndarray:
        """The rows as an N x 3 uint64 array (addr, len, dev_id)."""
        return np.array([r[:3] for r in self._rows], dtype=np.uint64).reshape(-1, 3)


class nixlXferDList(_DList):
    """Transfer descriptors: (addr, len, dev_id)."""


class nixlRegDList(_DList):
    """Registration descriptors: (addr, len, dev_id, meta info)."""

    _extra = "meta info"

    def trim(self) -> nixlXferDList:
        """The same regions as transfer descriptors (meta info dropped)."""
        return nixlXferDList(self._type, [r[:3] for r in self._rows])


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


class _CppAgentClass:
    """NIXL's C++ classes bound by pybind11, which ``nixl._api`` wraps: not carried (hmc's
    agent is Python over an :class:`hmc.Engine`)."""

    _name = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} (NIXL's C++ agent binding) is not carried by hmc.nixl; use "
            "hmc.nixl._api.nixl_agent and nixl_agent_config"
        )


class nixlAgent(_CppAgentClass):
    _name = "nixlAgent"


class nixlAgentConfig(_CppAgentClass):
    _name = "nixlAgentConfig"
