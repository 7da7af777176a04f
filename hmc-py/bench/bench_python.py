"""`cargo xtask bench python`: the Python API's synchronous one-sided ops, hmc against
Mooncake Transfer Engine's Python API (tcp protocol, P2PHANDSHAKE, transfer_sync_write /
transfer_sync_read), the same loop side by side in one run, two processes on loopback;
and the Python overhead per op: hmc's Python loop against the same calls made by a Rust
loop on the same engine (``Engine._transfer_sync_loop``).

    python bench_python.py [--seconds S] [--no-mooncake] [--no-default] [--floor ENGINE_BENCH]
    python bench_python.py hmc-target BYTES TRANSPORT   (internal: the hmc target process)
    python bench_python.py hmc-driver TRANSPORT         (internal: measures on request)

hmc runs twice: over its tcp transport (``{"transport": "tcp"}``: the like-for-like
comparison with Mooncake's tcp protocol) and with the engine's default options
(``transport=auto``: to a peer on the same host, cross-memory attach; what a user who
passes no options gets), the second from a process of its own. Each cell alternates the
systems three times and reports the medians. With ``--floor``, the path of hmc-engine's
engine bench binary, each round also measures this machine's TCP floor for the same op
(two processes spinning on one connection, no runtime, no protocol; that bench's
``--floor-client``), so a ratio can be read against what the machine allows at that
moment. Prints Markdown tables on stdout.

Beside each rate, the CPU it took (``_cpu``, as the Rust benches count it): user and
system CPU time of every process of that system over each round (hmc over tcp and Mooncake:
this driver process and their target; hmc with the default options: its driver and target;
the floor: its client and target), per GiB moved and per op, the median of the rounds.
hmc over tcp and Mooncake share this driver process, so each one's figure also holds the
other's idle threads.
"""

import argparse
import os
import subprocess
import sys
import time

import hmc
from _cpu import NOTE, cell, cpu_seconds, family_pids, per_gib, per_op_us

SIZES = [4096, 65536, 1 << 20]
HERE = os.path.dirname(os.path.abspath(__file__))
MOONCAKE_PEER = os.path.join(HERE, "..", "..", "hmc-engine", "benches", "mooncake_peer.py")


def options(transport):
    """The engine options of a run: ``tcp``, or (``default``) none at all."""
    return {"transport": "tcp"} if transport == "tcp" else {}


def hmc_target(size, transport):
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", options(transport))
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
    return timed_ops(seconds, call)[0]


def timed_ops(seconds, call):
    """One op of warm-up, then ops until ``seconds`` passed: (ops/s, ops including the
    warm-up)."""
    call()  # warm-up
    n, t0 = 0, time.perf_counter()
    while True:
        call()
        n += 1
        secs = time.perf_counter() - t0
        if secs >= seconds and n >= 3:
            return n / secs, n + 1


def with_cpu(pids, seconds, call):
    """``timed`` of ``call`` with the CPU of the processes ``pids``: (ops/s, CPU us/op)."""
    c0 = cpu_seconds(pids)
    rate, ops = timed_ops(seconds, call)
    return rate, per_op_us(cpu_seconds(pids) - c0, ops)


def remote_with_cpu(remote, opname, size, seconds):
    """A ``Remote``'s µs per op with the CPU of it and its children over the request: ops
    as its rate times the request's length, as bench_kv.py counts its floor."""
    pids = family_pids(remote.proc.pid)
    c0, t0 = cpu_seconds(pids), time.perf_counter()
    us = remote.us_per_op(opname, size, seconds)
    used, ops = cpu_seconds(pids) - c0, (time.perf_counter() - t0) / (us * 1e-6)
    return us, per_op_us(used, ops)


def median_cpu(xs):
    """The median of the rounds' CPU figures, None unless every round has one."""
    return None if not xs or any(x is None for x in xs) else median(xs)


class Hmc:
    """hmc's side: a target process and an engine here, connected, both with the options
    of ``transport`` (``tcp`` or ``default``)."""

    def __init__(self, transport):
        self.proc, self.address, self.remote = start(
            [sys.executable, __file__, "hmc-target", str(max(SIZES)), transport]
        )
        self.e = hmc.Engine()
        self.e.initialize("127.0.0.1:0", options(transport))
        self.local = bytearray(max(SIZES))
        self.h = self.e.register_mem(self.local)
        self.e.connect(self.address)

    def op(self, opname, size):
        op = hmc.TransferOp.WRITE if opname == "write" else hmc.TransferOp.READ
        descs = [hmc.TransferOpDesc(self.h.addr, self.remote, size)]
        e, address = self.e, self.address
        return lambda: e.transfer_sync(address, op, descs, timeout_ms=10_000)

    def overhead(self, opname, n, size):
        """(Python us/op, Rust us/op) of the same op on this engine: one descriptor of
        ``size`` bytes, or (size 0) an empty batch, which the engine completes without
        I/O, so only the cost of the call itself remains."""
        op = hmc.TransferOp.WRITE if opname == "write" else hmc.TransferOp.READ
        d = hmc.TransferOpDesc(self.h.addr, self.remote, size) if size else None
        descs = [d] if d else []
        e, address = self.e, self.address
        t0 = time.perf_counter()
        for _ in range(n):
            e.transfer_sync(address, op, descs, timeout_ms=10_000)
        py = (time.perf_counter() - t0) / n
        rust = e._transfer_sync_loop(address, op, d, n) / n
        return py * 1e6, rust * 1e6

    def close(self):
        self.e.finalize()
        self.proc.stdin.close()
        self.proc.wait(10)


class Mooncake:
    """Mooncake's side: its target process (hmc-engine/benches/mooncake_peer.py) and a
    TransferEngine here."""

    def __init__(self):
        from mooncake.engine import TransferEngine

        self.proc, port, self.remote = start(
            [sys.executable, MOONCAKE_PEER, "target", str(max(SIZES))]
        )
        self.te = TransferEngine()
        if self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            sys.exit("mooncake initialize failed")
        self.peer = f"127.0.0.1:{port}"
        self.local = self.te.allocate_managed_buffer(max(SIZES))

    def op(self, opname, size):
        te, peer, local, remote = self.te, self.peer, self.local, self.remote
        call = te.transfer_sync_write if opname == "write" else te.transfer_sync_read

        def one():
            if call(peer, local, remote, size) != 0:
                sys.exit(f"mooncake {opname} of {size} bytes failed")

        return one

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


class Remote:
    """A measuring process of its own that answers ``OP BYTES SECONDS`` lines on stdin with
    the µs per op it measured: the engine bench's ``--floor-client`` (the TCP floor), or this
    script's ``hmc-driver default`` (hmc with no options: ``auto`` loads UCX, whose memory
    hooks must not sit in the process that measures hmc's tcp and Mooncake)."""

    def __init__(self, cmd, what):
        self.what = what
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def us_per_op(self, opname, size, seconds):
        self.proc.stdin.write(f"{opname} {size} {seconds}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"{self.what} ended early (see its error above)")
        return float(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def hmc_driver(transport):
    """``hmc-driver TRANSPORT``: an hmc engine and its target, measuring on request."""
    ours = Hmc(transport)
    for line in sys.stdin:
        opname, size, seconds = line.split()
        print(1e6 / timed(float(seconds), ours.op(opname, int(size))), flush=True)
    ours.close()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and system")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--no-default", action="store_true", help="tcp only")
    ap.add_argument("--floor", metavar="ENGINE_BENCH", help="hmc-engine's engine bench binary")
    a = ap.parse_args()
    ours = Hmc("tcp")
    default = None
    if not a.no_default:
        default = Remote([sys.executable, __file__, "hmc-driver", "default"], "the hmc driver")
    theirs = None if a.no_mooncake else Mooncake()
    floor = Remote([a.floor, "--floor-client", str(max(SIZES))], "the floor client") if a.floor else None
    # Each cell alternates the systems three times (a third of the time each) and
    # keeps the median: the machine is shared, and load comes and goes.
    rows, default_rows, cpu = [], [], {}
    me = os.getpid()
    for opname in ("write", "read"):
        for size in SIZES:
            h, d, m, f = [], [], [], []
            hc, dc, mc, fc = [], [], [], []
            for _ in range(3):
                r, c = with_cpu([me, ours.proc.pid], a.seconds / 3, ours.op(opname, size))
                h.append(r)
                hc.append(c)
                if default:
                    us, c = remote_with_cpu(default, opname, size, a.seconds / 3)
                    d.append(1e6 / us)
                    dc.append(c)
                if theirs:
                    r, c = with_cpu([me, theirs.proc.pid], a.seconds / 3, theirs.op(opname, size))
                    m.append(r)
                    mc.append(c)
                if floor:
                    us, c = remote_with_cpu(floor, opname, size, a.seconds / 3)
                    f.append(us)
                    fc.append(c)
            rows.append((opname, size, median(h), median(m) if m else None, median(f) if f else None))
            default_rows.append((opname, size, median(d) if d else None, median(m) if m else None))
            for system, xs in (("hmc", hc), ("default", dc), ("mooncake", mc), ("floor", fc)):
                cpu[(system, opname, size)] = median_cpu(xs)
    overhead = {}
    n = 3_000 if a.seconds >= 1 else 1_000
    for opname in ("write", "read"):
        for size, label in ((4096, "4 KiB"), (0, "empty batch (no I/O)")):
            # Pairs, not the best of each: the host's speed moves between runs, and the
            # difference within a pair (taken seconds apart) is what Python adds.
            runs = [ours.overhead(opname, n * (10 if size == 0 else 1), size) for _ in range(9)]
            overhead[(opname, label)] = (
                median([r[0] for r in runs]),
                median([r[1] for r in runs]),
                median([r[0] - r[1] for r in runs]),
            )
    ours.close()
    for other in (default, theirs, floor):
        if other:
            other.close()
    print("## Python API: hmc vs Mooncake Transfer Engine (tcp), sync single ops, two processes on loopback\n")
    def gib(system, op, size):
        us = cpu.get((system, op, size))
        return cell(None if us is None else per_gib(us * 1e-6, size), 3)

    def us_op(system, op, size):
        return cell(cpu.get((system, op, size)), 1)

    print("| op | size | hmc ops/s | hmc GB/s | Mooncake ops/s | Mooncake GB/s | ratio "
          "| hmc CPU-s/GiB | Mooncake CPU-s/GiB | hmc CPU us/op | Mooncake CPU us/op |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for op, size, ops, m, _ in rows:
        gb = lambda o: o * size / 1e9  # noqa: E731
        print(
            f"| {op} | {size} | {ops:.0f} | {gb(ops):.3f} | "
            + (f"{m:.0f} | {gb(m):.3f} | {ops / m:.2f}x |" if m else "- | - | - |")
            + f" {gib('hmc', op, size)} | {gib('mooncake', op, size)} | "
            f"{us_op('hmc', op, size)} | {us_op('mooncake', op, size)} |"
        )
    print(f"\n{NOTE} hmc over tcp and Mooncake: this driver process and their target.")
    if floor:
        print("\n## the same sync ops vs this machine's TCP floor (two processes spinning on one connection, no runtime, no protocol)\n")
        print("| op | size | floor us/op | hmc us/op | hmc / floor | Mooncake us/op | Mooncake / floor "
              "| floor CPU-s/GiB | hmc CPU-s/GiB | Mooncake CPU-s/GiB | floor CPU us/op |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for op, size, ops, m, f in rows:
            us = 1e6 / ops
            print(
                f"| {op} | {size} | {f:.1f} | {us:.1f} | {us / f:.2f}x | "
                + (f"{1e6 / m:.1f} | {1e6 / m / f:.2f}x |" if m else "- | - |")
                + f" {gib('floor', op, size)} | {gib('hmc', op, size)} | "
                f"{gib('mooncake', op, size)} | {us_op('floor', op, size)} |"
            )
        print("\nThe floor's CPU: its client process and the floor's target.")
    if default:
        print("\n## hmc with the default options (transport=auto: cross-memory attach to a peer on this host) vs Mooncake Transfer Engine (tcp)\n")
        print("| op | size | hmc ops/s | hmc GB/s | hmc us/op | Mooncake ops/s | Mooncake GB/s | ratio "
              "| hmc CPU-s/GiB | Mooncake CPU-s/GiB | hmc CPU us/op |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for op, size, ops, m in default_rows:
            gb = lambda o: o * size / 1e9  # noqa: E731
            print(
                f"| {op} | {size} | {ops:.0f} | {gb(ops):.3f} | {1e6 / ops:.1f} | "
                + (f"{m:.0f} | {gb(m):.3f} | {ops / m:.2f}x |" if m else "- | - | - |")
                + f" {gib('default', op, size)} | {gib('mooncake', op, size)} | "
                f"{us_op('default', op, size)} |"
            )
        print("\nhmc with the default options: its driver process and its target.")
    print("\n## Python overhead per sync op (same engine and peer, 9 pairs of alternated runs; medians, what Python adds the median of the pairs' differences)\n")
    print("| op | call | Python loop us/op | Rust loop us/op | Python adds us |")
    print("| --- | --- | --- | --- | --- |")
    for (op, label), (py, rust, adds) in overhead.items():
        print(f"| {op} | {label} | {py:.2f} | {rust:.2f} | {adds:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "hmc-target":
        hmc_target(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 2 and sys.argv[1] == "hmc-driver":
        hmc_driver(sys.argv[2])
    else:
        main()
