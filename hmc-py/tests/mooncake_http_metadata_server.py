"""A metadata server speaking the protocol of Mooncake's ``mooncake_http_metadata_server``
(written here from its description, standard library only), for the tests of
``hmc.mooncake``'s HTTP metadata client and for ``upstream/run_mooncake_suite.py``.

One path (``/metadata``), the key in the query (``?key=``): ``GET`` answers the stored value
(200) or 404; ``PUT`` stores the body (200), refusing with 400 a key containing ``rpc_meta``
that is already there (an engine name in use); ``DELETE`` removes it (200) or 404; a missing
key is 400, another method 405. Bodies over :data:`MAX_BODY_BYTES` are refused with 413.

Run: ``python mooncake_http_metadata_server.py [--port N]``; it prints ``PORT <n>`` once it
listens on 127.0.0.1 and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PATH = "/metadata"
# The largest value stored (Mooncake's server has no limit; a test server needs one).
MAX_BODY_BYTES = 16 << 20


class _Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.values: dict[str, bytes] = {}


class _Handler(BaseHTTPRequestHandler):
    store: _Store

    def log_message(self, fmt, *args):  # quiet: the tests read stdout for the port only
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _key(self):
        parts = urlsplit(self.path)
        if parts.path != PATH:
            self._answer(404, b"no such path")
            return None
        key = parse_qs(parts.query).get("key", [""])[0].strip()
        if not key:
            self._answer(400, b"metadata key is required")
            return None
        return key

    def do_GET(self):
        key = self._key()
        if key is None:
            return
        with self.store.lock:
            value = self.store.values.get(key)
        if value is None:
            self._answer(404, b"metadata not found")
        else:
            self._answer(200, value)

    def do_PUT(self):
        key = self._key()
        if key is None:
            return
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY_BYTES:
            self._answer(413, b"value too large")
            return
        data = self.rfile.read(n)
        with self.store.lock:
            if "rpc_meta" in key and key in self.store.values:
                self._answer(400, b"Duplicate rpc_meta key not allowed")
                return
            self.store.values[key] = data
        self._answer(200, b"metadata updated")

    def do_DELETE(self):
        key = self._key()
        if key is None:
            return
        with self.store.lock:
            found = self.store.values.pop(key, None) is not None
        self._answer(200 if found else 404, b"metadata deleted" if found else b"metadata not found")

    def do_POST(self):
        self._answer(405, b"Method not allowed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    args = ap.parse_args()
    handler = type("Handler", (_Handler,), {"store": _Store()})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.daemon_threads = True

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
