"""NIXL's peer-to-peer metadata exchange for ``hmc.nixl``: the listen thread of an agent
made with ``enable_listen_thread=True`` (on ``listen_port``), and the calls that reach a
peer's (``send_local_metadata``, ``send_partial_agent_metadata``, ``fetch_remote_metadata``,
``invalidate_local_metadata`` with an ``ip_addr``).

A message is one byte of kind, four of length (big-endian) and the payload: ``S`` metadata
to load, ``F`` a request for the listener's own metadata (answered with an ``S`` on the same
connection), ``I`` an agent's name whose metadata to drop. Bounded: a payload over
``MAX_MESSAGE_BYTES`` closes the connection with an error naming the limit, a connection
idle for ``IO_TIMEOUT_S`` is closed, at most ``MAX_CONNECTIONS`` are served at once; the
metadata itself is checked (and authenticated, with an auth secret) by the engine when it
is loaded, as for ``add_remote_agent``.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable

from .logging import get_logger

_log = get_logger(__name__)

# The largest message (the engine's default `max_metadata_blob_len`, 16 MiB, and the name).
MAX_MESSAGE_BYTES = (16 << 20) + 4096
IO_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-message")
        buf += chunk
    return bytes(buf)


def read_message(s: socket.socket) -> tuple[bytes, bytes]:
    kind, n = struct.unpack(">cI", _read_exact(s, 5))
    if n > MAX_MESSAGE_BYTES:
        raise ValueError(
            f"a metadata message of {n} bytes exceeds MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES}); "
            "hmc.nixl metadata is bounded by the engine's max_metadata_blob_len"
        )
    return kind, _read_exact(s, n)


def write_message(s: socket.socket, kind: bytes, payload: bytes) -> None:
    s.sendall(struct.pack(">cI", kind, len(payload)) + payload)


def exchange(ip: str, port: int, kind: bytes, payload: bytes, want_reply: bool) -> bytes | None:
    """One message to the listener at ``ip:port`` (and its answer when ``want_reply``)."""
    with socket.create_connection((ip, port), timeout=IO_TIMEOUT_S) as s:
        write_message(s, kind, payload)
        if want_reply:
            k, body = read_message(s)
            if k != b"S":
                raise ValueError(f"the listener at {ip}:{port} answered a fetch with {k!r}")
            return body
    return None


class Listener:
    """The listen thread: ``load(md)`` for ``S``, ``own()`` answers ``F``, ``drop(name)`` for
    ``I``. Closed by :meth:`close`."""

    def __init__(self, host: str, port: int, load: Callable[[bytes], object],
                 own: Callable[[], bytes], drop: Callable[[str], None]):
        self._load, self._own, self._drop = load, own, drop
        self._sock = socket.create_server((host, port), reuse_port=False)
        self.port = self._sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = False
        threading.Thread(target=self._accept, name="hmc-nixl-listen", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                _log.warning("metadata listener: over MAX_CONNECTIONS (%d); closing %s", MAX_CONNECTIONS, peer)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            kind, body = read_message(conn)
            if kind == b"S":
                self._load(body)
            elif kind == b"F":
                write_message(conn, b"S", self._own())
            elif kind == b"I":
                self._drop(body.decode())
            else:
                _log.warning("metadata listener: unknown message %r from %s", kind, peer)
        except Exception as e:  # noqa: BLE001 (one bad peer never stops the listener)
            _log.error("metadata listener: a message from %s was refused: %s", peer, e)
        finally:
            conn.close()
            self._slots.release()
