"""Mooncake Transfer Engine peer for `cargo xtask bench engine`: the same one-sided
WRITE/READ loop as hmc-engine's bench, through Mooncake's Python API (tcp protocol,
P2PHANDSHAKE metadata, one op at a time with transfer_sync_write/read).

  target:    python mooncake_peer.py target BYTES
             prints "READY <rpc port> <buffer address>", serves until stdin closes
  steps:     python mooncake_peer.py steps PORT REMOTE_ADDR SIZES
             warms every (op, size) up, prints "READY", then runs one timed loop per
             stdin line "OP SIZE SECONDS" (op write|read) and prints its JSON object;
             the engine bench alternates these steps with its own rounds
"""

import json
import sys
import time

from mooncake.engine import TransferEngine


def engine():
    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        sys.exit(f"mooncake initialize failed: {rc}")
    return te


def target(size):
    te = engine()
    buf = te.allocate_managed_buffer(size)
    if not buf:
        sys.exit("mooncake: allocate_managed_buffer failed")
    print(f"READY {te.get_rpc_port()} {buf}", flush=True)
    sys.stdin.read()


def timed_loop(te, peer, local, remote, op, size, seconds):
    """One warm-up op, then ops of `size` bytes until `seconds` passed; prints the JSON row:
    system, op, size, ops, secs."""
    call = te.transfer_sync_write if op == "write" else te.transfer_sync_read
    if call(peer, local, remote, size) != 0:  # warm-up, and the handshake
        sys.exit(f"mooncake {op} of {size} bytes failed")
    n = 0
    start = time.perf_counter()
    while True:
        if call(peer, local, remote, size) != 0:
            sys.exit(f"mooncake {op} of {size} bytes failed")
        n += 1
        secs = time.perf_counter() - start
        if secs >= seconds:
            break
    print(json.dumps({"system": "mooncake", "op": op, "size": size,
                      "ops": n, "secs": secs}), flush=True)


def steps(port, remote, sizes):
    te = engine()
    peer = f"127.0.0.1:{port}"
    local = te.allocate_managed_buffer(max(sizes))
    if not local:
        sys.exit("mooncake: allocate_managed_buffer failed")
    for op, call in (("write", te.transfer_sync_write), ("read", te.transfer_sync_read)):
        for size in sizes:
            if call(peer, local, remote, size) != 0:
                sys.exit(f"mooncake {op} of {size} bytes failed")
    print("READY", flush=True)
    for line in sys.stdin:
        op, size, seconds = line.split()
        timed_loop(te, peer, local, remote, op, int(size), float(seconds))


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "target":
        target(int(sys.argv[2]))
    elif role == "steps":
        steps(int(sys.argv[2]), int(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")])
    else:
        sys.exit(__doc__)
