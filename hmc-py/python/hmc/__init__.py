"""HMC from Python: move bytes between registered memories of processes, zero-copy.

- :class:`Engine`: a one-sided transfer engine (HIXL's calls in snake_case):
  ``initialize``, ``register_mem``, ``connect``, ``transfer_sync``, ``transfer_async``,
  ``send_notify``/``get_notifies``, ``finalize``.
- :mod:`hmc.kv`: KV-cache transfer between prefill and decode clusters
  (LLM-DataDist's calls: ``allocate_cache``, ``pull_kv_blocks``, ...).
- :mod:`hmc.rpc`: an RPC client and a server with Python handlers.
- :func:`get_include`, :func:`get_library_dir`, :func:`get_pkgconfig_dir`,
  :func:`get_cmake_dir`: the C and C++ API (``hmc/hmc.h``, ``hmc/hmc.hpp``,
  ``libhmc.so.0``, ``hmc.pc``, the CMake package) that the wheel carries, to build C and
  C++ programs against.
- Errors: :class:`HmcError` and subclasses that also derive from the matching built-in
  (``hmc.TimeoutError`` is a ``TimeoutError``, ``hmc.InvalidArgumentError`` a
  ``ValueError``, ...).

Example::

    import hmc
    with hmc.Engine() as a, hmc.Engine() as b:
        a.initialize("127.0.0.1:0"); b.initialize("127.0.0.1:0")
        src, dst = bytearray(b"x" * 4096), bytearray(4096)
        hs, hd = a.register_mem(src), b.register_mem(dst)
        a.connect(b.local_address)
        a.transfer_sync(b.local_address, hmc.TransferOp.WRITE,
                        [hmc.TransferOpDesc(hs.addr, hd.addr, 4096)])
        assert dst == src
"""

from . import kv, rpc
from ._capi_paths import get_cmake_dir, get_include, get_library_dir, get_pkgconfig_dir
from ._errors import (
    BackendUnavailableError,
    CancelledError,
    HmcError,
    InvalidArgumentError,
    LimitError,
    MismatchError,
    NotConnectedError,
    NotRegisteredError,
    PeerGoneError,
    RpcError,
    StateError,
    TimeoutError,
    UnavailableError,
    UnknownKeyError,
    UnsupportedError,
)
from ._hmc import (
    Engine,
    MemHandle,
    HostMemory,
    MemType,
    PreparedList,
    PreparedXfer,
    TransferOp,
    TransferOpDesc,
    TransferReq,
    TransferStatus,
)

__all__ = [
    "Engine",
    "MemHandle",
    "HostMemory",
    "MemType",
    "PreparedList",
    "PreparedXfer",
    "TransferOp",
    "TransferOpDesc",
    "TransferReq",
    "TransferStatus",
    "kv",
    "rpc",
    "get_include",
    "get_library_dir",
    "get_pkgconfig_dir",
    "get_cmake_dir",
    "HmcError",
    "TimeoutError",
    "InvalidArgumentError",
    "NotRegisteredError",
    "NotConnectedError",
    "PeerGoneError",
    "BackendUnavailableError",
    "MismatchError",
    "UnavailableError",
    "StateError",
    "LimitError",
    "UnknownKeyError",
    "UnsupportedError",
    "CancelledError",
    "RpcError",
]
