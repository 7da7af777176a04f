"""``nixl._utils``: raw host buffers for examples and tests (``malloc``/``free`` through
libc), a 0xBA fill, and a byte comparison."""

import ctypes
import ctypes.util

from .logging import get_logger

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_log = get_logger(__name__)


def malloc_passthru(size: int) -> int:
    """``malloc(size)``; the address (0 if it failed)."""
    return _libc.malloc(int(size)) or 0


def free_passthru(addr: int) -> None:
    """``free(addr)`` of an address from :func:`malloc_passthru`."""
    _libc.free(int(addr))


def ba_buf(addr: int, size: int) -> None:
    """Fills ``size`` bytes at ``addr`` with 0xBA."""
    ctypes.memset(int(addr), 0xBA, int(size))


def verify_transfer(addr1: int, addr2: int, size: int) -> None:
    """Compares ``size`` bytes at two addresses and logs an error when they differ (NIXL's
    returns nothing either way)."""
    a = ctypes.string_at(int(addr1), int(size))
    b = ctypes.string_at(int(addr2), int(size))
    if a != b:
        _log.error("verify_transfer: the %d bytes at %#x and %#x differ", size, addr1, addr2)
