"""The exceptions of ``hmc``: one base class, :class:`HmcError`, and subclasses that also
derive from the matching built-in exception, so ``except TimeoutError`` and ``except
ValueError`` keep working. Every message says what to do about the failure."""

from __future__ import annotations

import builtins

__all__ = [
    "HmcError",
    "TimeoutError",
    "InvalidArgumentError",
    "NotRegisteredError",
    "NotConnectedError",
    "UnavailableError",
    "PeerGoneError",
    "BackendUnavailableError",
    "MismatchError",
    "StateError",
    "LimitError",
    "UnknownKeyError",
    "UnsupportedError",
    "CancelledError",
    "RpcError",
]


class HmcError(Exception):
    """Base class of every error ``hmc`` raises."""


class TimeoutError(HmcError, builtins.TimeoutError):
    """An operation did not finish within its timeout (a silent or slow peer). A
    transfer that timed out no longer touches its memory. Pass a longer ``timeout_ms``."""


class InvalidArgumentError(HmcError, builtins.ValueError):
    """A bad argument: an unknown option, a zero length, overlapping registrations, a
    read-only buffer as the target of a READ, KV layouts that do not fit each other."""


class NotRegisteredError(HmcError, builtins.ValueError):
    """An address range lies in no registered region (or runs past the end of one),
    locally or at the peer, or the memory was deregistered. Nothing was moved."""


class NotConnectedError(HmcError, builtins.ConnectionError):
    """The peer is unknown to this engine (or cluster is not linked): connect first."""


class UnavailableError(HmcError, builtins.ConnectionError):
    """The peer or a library could not be reached: nobody listens at the address, the
    connection was lost, or the peer's metadata service failed."""


class PeerGoneError(UnavailableError):
    """The peer went away: its connection was lost, nobody listens at its address any more,
    or it left the cluster. Drop it (and what was in flight with it); connect again once it
    is back."""


class BackendUnavailableError(UnavailableError):
    """A library or device this process needs is missing here (a vendor driver, a NIC): a
    local problem, not the peer's. The message names it and how to install it."""


class MismatchError(UnavailableError):
    """Bytes given as a peer's metadata are not usable by this engine: truncated, of
    another kind or version, or signed with another secret. Nothing was added. (An
    :class:`UnavailableError`, as such failures were before this class existed.)"""


class StateError(HmcError, builtins.RuntimeError):
    """The object is in the wrong state for the call: finalized, already connected,
    shut down, or memory still exported to Python views."""


class LimitError(HmcError, builtins.RuntimeError):
    """A configured limit was reached; the message names the limit and the option that
    raises it."""


class UnknownKeyError(HmcError, builtins.KeyError):
    """Nothing is published under that KV-cache key at the peer."""

    def __str__(self) -> str:  # KeyError quotes its argument; say it plainly.
        return str(self.args[0]) if self.args else ""


class UnsupportedError(HmcError, builtins.NotImplementedError):
    """The memory or operation is not supported here (a DLPack device kind with no HMC
    backend, device memory a transport cannot register)."""


class CancelledError(HmcError):
    """The operation was cancelled (``TransferReq.cancel()``, or Ctrl-C during a wait);
    its memory is no longer touched."""


class RpcError(HmcError):
    """The RPC server answered with a non-OK status. ``status`` is the numeric status,
    ``status_name`` its name (``INTERNAL`` for a handler that raised)."""

    def __init__(self, message: str, status: int = 0, status_name: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.status_name = status_name


def _resolve(fut, exc) -> None:
    """Completes an asyncio future from the runtime (``await req``), unless it was
    cancelled meanwhile."""
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


# Shown as hmc.TimeoutError etc. (where users import them from).
for _name in __all__:
    globals()[_name].__module__ = "hmc"
del _name
