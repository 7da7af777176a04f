"""`cargo xtask bench python`: the Python API's synchronous one-sided ops, hmc against
Mooncake Transfer Engine's Python API (tcp protocol, P2PHANDSHAKE, transfer_sync_write /
transfer_sync_read), the same loop side by side in one run, two processes on loopback;
and the Python overhead per op: hmc's Python loop against the same calls made by a Rust
loop on the same engine (``Engine._transfer_sync_loop``).

    python bench_python.py [--seconds S] [--no-mooncake]
    python bench_python.py hmc-target BYTES   (internal: the hmc target process)

Prints a Markdown table on stdout.
"""

import argparse
import os
import subprocess
import sys
import time

import hmc

SIZES = [4096, 65536, 1 << 20]
HERE = os.path.dirname(os.path.abspath(__file__))
MOONCAKE_PEER = os.path.join(HERE, "..", "..", "hmc-engine", "benches", "mooncake_peer.py")


def hmc_target(size):
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {"transport": "tcp"})
    buf = bytearray(size)
    h = e.register_mem(buf)
    print(f"READY {e.local_address} {h.addr}", flush=True)
    sys.stdin.read()
    e.finalize()


def start(cmd):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    if not line or line[0] != "READY":
        p.kill()
        sys.exit(f"target {cmd} did not start")
    return p, line[1], int(line[2])


def timed(seconds, call):
    call()  # warm-up
    n, t0 = 0, time.perf_counter()
    while True:
        call()
        n += 1
        secs = time.perf_counter() - t0
        if secs >= seconds and n >= 3:
            return n / secs


def bench_hmc(seconds):
    p, address, remote = start([sys.executable, __file__, "hmc-target", str(max(SIZES))])
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {"transport": "tcp"})
    local = bytearray(max(SIZES))
    h = e.register_mem(local)
    e.connect(address)
    out, overhead = {}, {}
    for opname, op in (("write", hmc.TransferOp.WRITE), ("read", hmc.TransferOp.READ)):
        for size in SIZES:
            descs = [hmc.TransferOpDesc(h.addr, remote, size)]
            out[(opname, size)] = timed(
                seconds, lambda: e.transfer_sync(address, op, descs, timeout_ms=10_000)
            )
        # Python overhead per op: the same 4 KiB op, Python loop against Rust loop,
        # alternated three times (the machine is shared: take the best of each).
        d = hmc.TransferOpDesc(h.addr, remote, 4096)
        descs = [d]
        py, rust = [], []
        for _ in range(3):
            n = 20_000 if seconds >= 1 else 5_000
            t0 = time.perf_counter()
            for _ in range(n):
                e.transfer_sync(address, op, descs, timeout_ms=10_000)
            py.append((time.perf_counter() - t0) / n)
            rust.append(e._transfer_sync_loop(address, op, d, n) / n)
        overhead[opname] = (min(py) * 1e6, min(rust) * 1e6)
    e.finalize()
    p.stdin.close()
    p.wait(10)
    return out, overhead


def bench_mooncake(seconds):
    from mooncake.engine import TransferEngine

    p, port, remote = start([sys.executable, MOONCAKE_PEER, "target", str(max(SIZES))])
    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        sys.exit("mooncake initialize failed")
    peer = f"127.0.0.1:{port}"
    local = te.allocate_managed_buffer(max(SIZES))
    out = {}
    for opname in ("write", "read"):
        call = te.transfer_sync_write if opname == "write" else te.transfer_sync_read
        for size in SIZES:

            def one():
                if call(peer, local, remote, size) != 0:
                    sys.exit(f"mooncake {opname} of {size} bytes failed")

            out[(opname, size)] = timed(seconds, one)
    p.stdin.close()
    p.wait(10)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--no-mooncake", action="store_true")
    a = ap.parse_args()
    ours, overhead = bench_hmc(a.seconds)
    theirs = {} if a.no_mooncake else bench_mooncake(a.seconds)
    print("## Python API: hmc vs Mooncake Transfer Engine (tcp), sync single ops, two processes on loopback\n")
    print("| op | size | hmc ops/s | hmc GB/s | Mooncake ops/s | Mooncake GB/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (op, size), ops in ours.items():
        m = theirs.get((op, size))
        gb = lambda o: o * size / 1e9  # noqa: E731
        print(
            f"| {op} | {size} | {ops:.0f} | {gb(ops):.3f} | "
            + (f"{m:.0f} | {gb(m):.3f} | {ops / m:.2f}x |" if m else "- | - | - |")
        )
    print("\n## Python overhead per sync op (4 KiB, same engine and peer, best of 3)\n")
    print("| op | Python loop us/op | Rust loop us/op | Python adds us |")
    print("| --- | --- | --- | --- |")
    for op, (py, rust) in overhead.items():
        print(f"| {op} | {py:.2f} | {rust:.2f} | {py - rust:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "hmc-target":
        hmc_target(int(sys.argv[2]))
    else:
        main()
