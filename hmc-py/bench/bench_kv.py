"""`cargo xtask bench kv`: a request's KV cache moved in vLLM's pattern, hmc beside NIXL
and Mooncake Transfer Engine, all in one run.

The pattern (vLLM's NixlConnector): the prefill process registers one region per layer of
``--blocks`` blocks of ``--block`` bytes; the decode process prepares a descriptor per
(layer, block) once, on both sides, and per request READs (or WRITEs) ``--per-request``
random blocks of every layer, with a notification to the other side. Requests per second,
two processes on loopback.

Systems (each a driver process of its own with its own target process):

- ``hmc`` (no options: ``auto``, cross-memory attach to a peer on this host) and
  ``hmc-tcp`` (``transport=tcp``): prepared lists, per request ``make_transfer`` of the
  request's indices with a notification, ``post``, ``wait``, ``release``; from Python,
  and the same loop run by Rust (``_prepared_loop``: what Python adds);
- ``hmc-alloc``: ``hmc`` with the target's cache allocated by its engine
  (``Engine.alloc_mem``: shared memory, which the driver copies with ``memcpy``) instead
  of numpy arrays of its own;
- ``nixl`` (1.5.1, UCX, DRAM, default transports) and ``nixl-tcp`` (``UCX_TLS=tcp``):
  ``prep_xfer_dlist`` on both sides, per request ``make_prepped_xfer`` with a
  notification, ``transfer``, ``check_xfer_state`` until ``DONE``, ``release_xfer_handle``;
- ``mooncake`` (tcp, P2PHANDSHAKE): ``batch_transfer_sync_read/write`` of the request's
  blocks (no prepared lists or notifications in its API);
- ``hmc-nixl`` and ``hmc-mooncake``: the NIXL and Mooncake loops above, unchanged, on
  ``hmc.nixl`` (backend ``UCX``: hmc's default choice) and ``hmc.mooncake`` (tcp): what a
  stack that only changed its import gets;
- ``memcpy``: the same blocks copied in one process (what memory allows);
- ``floor``: hmc-engine's engine bench TCP floor for one op of the request's bytes
  (``--floor``).

Bytes are checked on the first request of each system (READ: against the target's fill;
WRITE: by the target's digests). Rounds alternate the systems; medians are printed. The systems not being measured are stopped
(SIGSTOP of their process group) so that their idle threads do not share the 2 cores. A
preparation table beside NIXL's: seconds and resident bytes per descriptor to build and
prepare ``--prep`` block descriptors on both sides, and the same as strided entries: hmc's
own calls (``hmc``), NIXL's calls on hmc.nixl (``hmc-nixl``: an N x 3 array through
``get_xfer_descs``, then ``prep_xfer_dlist``) and on NIXL.

    python bench_kv.py [--rounds N] [--seconds S] [--systems a,b] [--floor BIN]
                       [--nixl-python PY] [--mooncake-python PY]
"""

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

from _cpu import cpu_seconds, group_pids

HERE = os.path.abspath(__file__)


def page_aligned(n):
    """``n`` zeroed bytes starting on a page boundary. numpy puts a large array 16 bytes
    past a page (malloc's header); a framework's tensors start 64-byte aligned or better
    (PyTorch's CPU allocator), and a copy whose source and destination are misaligned to
    each other runs far slower than one between two equally aligned buffers, which would
    favour the in-process memcpy row (numpy on both sides) over every cross-process one."""
    import numpy as np

    raw = np.zeros(n + 4096, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 4096
    return raw[skip:skip + n]


def pattern(layer, n):
    """The fill of layer ``layer`` (bytes), the same in every system's target, page-aligned
    (``page_aligned``)."""
    import numpy as np

    out = page_aligned(n)
    out[:] = np.random.default_rng(1000 + layer).integers(0, 256, n, dtype=np.uint8)
    return out


def digest(b):
    return hashlib.sha256(bytes(b)).hexdigest()[:16]


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def say(*words):
    print(*words, flush=True)


def expect(stream, first):
    """The next line whose first word is ``first`` (NIXL and UCX log to stdout too)."""
    for line in stream:
        w = line.split()
        if w and w[0] == first:
            return w
    return None


# ---------------------------------------------------------------- targets (the prefill side)


def serve_digests(read_block):
    """Answers ``digest L:B,...`` lines with the digests of those blocks; ends on EOF."""
    for line in sys.stdin:
        w = line.split()
        if w and w[0] == "digest":
            items = [x.split(":") for x in w[1].split(",")]
            say("DIGESTS", *[digest(read_block(int(l), int(b))) for l, b in items])


def hmc_target(a):
    import threading

    import hmc

    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {"transport": "tcp"} if a.system == "hmc-tcp" else {})
    n = a.blocks * a.block
    if a.system == "hmc-alloc":
        import numpy as np

        regions = []
        for i in range(a.layers):
            view = np.frombuffer(e.alloc_mem(n), dtype=np.uint8)  # the view keeps it
            view[:] = pattern(i, n)
            regions.append(view)
    else:
        regions = [pattern(i, n) for i in range(a.layers)]
        for r in regions:
            e.register_mem(r)

    def drain():  # a prefill engine takes its notifications as they come
        while True:
            e.get_notifications()
            time.sleep(0.001)

    threading.Thread(target=drain, daemon=True).start()
    say("READY", e.local_metadata().hex(), *[r.ctypes.data for r in regions])
    serve_digests(lambda l, b: regions[l][b * a.block:(b + 1) * a.block])


def nixl_api(a):
    """NIXL's ``_api``, or hmc.nixl's for the ``hmc-nixl`` row (the same code on both)."""
    import importlib

    return importlib.import_module("hmc.nixl._api" if a.system == "hmc-nixl" else "nixl_cu12._api")


def mooncake_engine(a):
    """Mooncake's ``mooncake.engine``, or hmc.mooncake for the ``hmc-mooncake`` row."""
    import importlib

    return importlib.import_module("hmc.mooncake" if a.system == "hmc-mooncake" else "mooncake.engine")


def nixl_target(a):
    import threading

    api = nixl_api(a)
    nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config

    agent = nixl_agent("prefill", nixl_agent_config(backends=["UCX"]))
    regions = [pattern(i, a.blocks * a.block) for i in range(a.layers)]
    agent.register_memory([(r.ctypes.data, r.nbytes, 0, "") for r in regions], "DRAM")

    def drain():
        while True:
            agent.get_new_notifs()
            time.sleep(0.001)

    say("READY", agent.get_agent_metadata().hex(), *[r.ctypes.data for r in regions])
    peer_md = bytes.fromhex(sys.stdin.readline().strip())
    agent.add_remote_agent(peer_md)
    threading.Thread(target=drain, daemon=True).start()
    say("OK")
    serve_digests(lambda l, b: regions[l][b * a.block:(b + 1) * a.block])


def mooncake_target(a):
    import ctypes

    TransferEngine = mooncake_engine(a).TransferEngine  # noqa: N806

    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        sys.exit("mooncake initialize failed")
    n = a.blocks * a.block
    bases = [te.allocate_managed_buffer(n) for _ in range(a.layers)]
    for i, base in enumerate(bases):
        ctypes.memmove(base, pattern(i, n).tobytes(), n)
    say("READY", te.get_rpc_port(), *bases)
    serve_digests(lambda l, b: ctypes.string_at(bases[l] + b * a.block, a.block))


# ---------------------------------------------------------------- drivers (the decode side)


def start_target(a, python=None):
    cmd = [python or sys.executable, HERE, "target", a.system, *passthrough(a)]
    env = dict(os.environ)
    if a.system == "nixl-tcp":
        env["UCX_TLS"] = "tcp"
    # The target sets its own death signal (the driver may have threads by now, and a
    # preexec_fn is not safe to run in a fork of a threaded process).
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    w = expect(p.stdout, "READY")
    if not w:
        sys.exit(f"{a.system}: the target did not start")
    return p, w[1], [int(x) for x in w[2:]]


def passthrough(a):
    return ["--layers", str(a.layers), "--blocks", str(a.blocks), "--block", str(a.block),
            "--per-request", str(a.per_request)]


def requests(a, n, seed):
    """``n`` requests: per request, (local entry ids, remote entry ids), layer-major."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ours = np.concatenate([l * a.blocks + rng.choice(a.blocks, a.per_request, replace=False)
                               for l in range(a.layers)])
        theirs = np.concatenate([l * a.blocks + rng.choice(a.blocks, a.per_request, replace=False)
                                 for l in range(a.layers)])
        out.append((ours, theirs))
    return out


def table(addrs, blocks, block):
    import numpy as np

    base = np.repeat(np.array(addrs, dtype=np.int64), blocks)
    offs = np.tile(np.arange(blocks, dtype=np.int64) * block, len(addrs))
    return np.stack([base + offs, np.full_like(base, block), np.zeros_like(base)], axis=1)


def check(a, target, op, local_regions, req):
    """The first request's bytes: READ against the target's fill, WRITE by its digests."""
    ours, theirs = req
    blk = lambda regions, e: regions[e // a.blocks][(e % a.blocks) * a.block:(e % a.blocks + 1) * a.block]  # noqa: E731
    if op == "read":
        fill = [pattern(i, a.blocks * a.block) for i in range(a.layers)]
        bad = sum(digest(blk(local_regions, o)) != digest(blk(fill, t)) for o, t in zip(ours, theirs))
    else:
        items = ",".join(f"{t // a.blocks}:{t % a.blocks}" for t in theirs)
        target.stdin.write(f"digest {items}\n")
        target.stdin.flush()
        got = expect(target.stdout, "DIGESTS")[1:]
        bad = sum(d != digest(blk(local_regions, o)) for d, o in zip(got, ours))
    if bad:
        sys.exit(f"{a.system} {op}: {bad} of {len(ours)} blocks differ on the first request")


def driver(a):
    """Runs one system; answers ``OP SECONDS`` lines with ``{"rps":…, "rust_rps":…}``."""
    import numpy as np

    reqs = requests(a, 64, 7)
    local = [page_aligned(a.blocks * a.block) for _ in range(a.layers)]
    for i, r in enumerate(local):
        r[:] = (np.arange(r.size) * (i + 3)).astype(np.uint8)
    run, rust = None, None
    target = None
    if a.system in ("hmc", "hmc-tcp", "hmc-alloc"):
        import hmc
        from hmc import _hmc

        target, blob, addrs = start_target(a)
        e = hmc.Engine()
        e.initialize("127.0.0.1:0", {"transport": "tcp"} if a.system == "hmc-tcp" else {})
        for r in local:
            e.register_mem(r)
        peer = e.add_remote(bytes.fromhex(blob))
        ll = e.prepare_local(table([r.ctypes.data for r in local], a.blocks, a.block))
        rl = e.prepare_remote(peer, table(addrs, a.blocks, a.block))
        ops = {"read": hmc.TransferOp.READ, "write": hmc.TransferOp.WRITE}

        def run(op, req):
            x = e.make_transfer(ops[op], ll, req[0], rl, req[1], notif_msg=b"req")
            x.post()
            if x.wait() != hmc.TransferStatus.COMPLETED:
                sys.exit(f"hmc {op}: {x.error()}")
            x.release()

        def rust(op, batch):
            return _hmc._prepared_loop(e, ops[op], ll, rl, batch, b"req")

    elif a.system in ("nixl", "nixl-tcp", "hmc-nixl"):
        api = nixl_api(a)
        nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config

        target, md, addrs = start_target(a, None if a.system == "hmc-nixl" else a.nixl_python)
        agent = nixl_agent("decode", nixl_agent_config(backends=["UCX"]))
        agent.register_memory([(r.ctypes.data, r.nbytes, 0, "") for r in local], "DRAM")
        name = agent.add_remote_agent(bytes.fromhex(md))
        target.stdin.write(agent.get_agent_metadata().hex() + "\n")
        target.stdin.flush()
        assert expect(target.stdout, "OK")
        lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", table([r.ctypes.data for r in local], a.blocks, a.block), "DRAM")
        rh = agent.prep_xfer_dlist(name, table(addrs, a.blocks, a.block), "DRAM")

        def run(op, req):
            h = agent.make_prepped_xfer(op.upper(), lh, req[0].tolist(), rh, req[1].tolist(), b"req")
            state = agent.transfer(h)
            while state != "DONE":
                if state == "ERR":
                    sys.exit(f"nixl {op} failed")
                state = agent.check_xfer_state(h)
            agent.release_xfer_handle(h)

    elif a.system in ("mooncake", "hmc-mooncake"):
        TransferEngine = mooncake_engine(a).TransferEngine  # noqa: N806

        target, port, addrs = start_target(a, None if a.system == "hmc-mooncake" else a.mooncake_python)
        te = TransferEngine()
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            sys.exit("mooncake initialize failed")
        for r in local:
            te.register_memory(r.ctypes.data, r.nbytes)
        peer = f"127.0.0.1:{port}"
        la = [r.ctypes.data for r in local]

        def run(op, req):
            src = [la[o // a.blocks] + (o % a.blocks) * a.block for o in req[0].tolist()]
            dst = [addrs[t // a.blocks] + (t % a.blocks) * a.block for t in req[1].tolist()]
            call = te.batch_transfer_sync_read if op == "read" else te.batch_transfer_sync_write
            if call(peer, src, dst, [a.block] * len(src)) != 0:
                sys.exit(f"mooncake {op} failed")

    elif a.system == "memcpy":
        from hmc import _hmc

        fill = [pattern(i, a.blocks * a.block) for i in range(a.layers)]
        la, fa = [r.ctypes.data for r in local], [r.ctypes.data for r in fill]
        at = lambda bases, e: bases[e // a.blocks] + (e % a.blocks) * a.block  # noqa: E731
        plans = [(np.array([at(la, o) for o in q[0]], dtype=np.uint64),
                  np.array([at(fa, t) for t in q[1]], dtype=np.uint64)) for q in reqs]

        def run(op, req):
            k = next(i for i, q in enumerate(reqs) if q[0] is req[0])
            d, s = plans[k]
            _hmc._copy_blocks(d, s, a.block, 1) if op == "read" else _hmc._copy_blocks(s, d, a.block, 1)

    else:
        sys.exit(f"unknown system {a.system}")
    checked = set()
    say("READY")
    for line in sys.stdin:
        op, seconds = line.split()
        if op not in checked:
            if a.system != "memcpy":
                run(op, reqs[0])
                check(a, target, op, local, reqs[0])
            checked.add(op)
        # The CPU of both sides of this system (this driver and its target, every thread),
        # over the measured loop only.
        pids = [os.getpid()] + ([target.pid] if target is not None else [])
        n, c0, t0 = 0, cpu_seconds(pids), time.perf_counter()
        while time.perf_counter() - t0 < float(seconds) or n < 3:
            run(op, reqs[n % len(reqs)])
            n += 1
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pids) - c0
        moved = n * a.layers * a.per_request * a.block
        out = {"rps": n / elapsed, "cpu_s_per_gib": cpu / (moved / (1 << 30))}
        if rust:
            batch = [reqs[i % len(reqs)] for i in range(max(n, 8))]
            out["rust_rps"] = len(batch) / rust(op, batch)
        say(json.dumps(out))


# ---------------------------------------------------------------- preparation


def prep(a):
    """``prep SYSTEM N``: seconds and resident bytes per descriptor for N block descriptors
    built as an N x 3 array and prepared on both sides (and as strided entries)."""
    import numpy as np

    n, block = a.prep, 16
    mem = np.zeros(n * block, dtype=np.uint8)
    mem2 = np.zeros(n * block, dtype=np.uint8)
    out = {}
    if a.system.startswith("hmc"):
        import hmc

        t, e = hmc.Engine(), hmc.Engine()
        t.initialize("127.0.0.1:0", {"transport": "tcp"})
        e.initialize("127.0.0.1:0", {"transport": "tcp"})
        t.register_mem(mem2)
        e.register_mem(mem)
        peer = e.add_remote(t.local_metadata())
        for kind in ("blocks", "strided"):
            r0, t0 = rss(), time.perf_counter()
            if kind == "blocks":
                ld = table([mem.ctypes.data], n, block)
                rd = table([mem2.ctypes.data], n, block)
            else:
                ld = np.array([[mem.ctypes.data, block, 0, block, n]])
                rd = np.array([[mem2.ctypes.data, block, 0, block, n]])
            lists = (e.prepare_local(ld), e.prepare_remote(peer, rd))
            del ld, rd
            out[kind] = {"secs": time.perf_counter() - t0, "bytes": rss() - r0}
            del lists
    else:
        # NIXL's calls as its users make them, on NIXL or on hmc.nixl (``hmc-nixl``).
        api = nixl_api(a)
        nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config

        t = nixl_agent("t", nixl_agent_config(backends=["UCX"]))
        e = nixl_agent("e", nixl_agent_config(backends=["UCX"]))
        t.register_memory([(mem2.ctypes.data, mem2.nbytes, 0, "")], "DRAM")
        e.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")], "DRAM")
        name = e.add_remote_agent(t.get_agent_metadata())
        for kind in ("blocks", "strided"):
            r0, t0 = rss(), time.perf_counter()
            if kind == "blocks":
                ld = table([mem.ctypes.data], n, block)
                rd = table([mem2.ctypes.data], n, block)
                hs = (e.prep_xfer_dlist("NIXL_INIT_AGENT", e.get_xfer_descs(ld, "DRAM")),
                      e.prep_xfer_dlist(name, e.get_xfer_descs(rd, "DRAM")))
            else:
                ld = np.array([[mem.ctypes.data, block, 0, block, n]])
                rd = np.array([[mem2.ctypes.data, block, 0, block, n]])
                hs = (e.prep_xfer_dlist("NIXL_INIT_AGENT", ld, "DRAM"), e.prep_xfer_dlist(name, rd, "DRAM"))
            del ld, rd
            out[kind] = {"secs": time.perf_counter() - t0, "bytes": rss() - r0}
            del hs
    say(json.dumps(out))


# ---------------------------------------------------------------- the run


def die_with_parent():
    """In a child before it runs: SIGKILL it when the process that started it dies, however
    that dies (a SIGKILL of the bench included, which no handler sees). A stopped child is
    killed too: SIGKILL needs no SIGCONT."""
    import ctypes

    PR_SET_PDEATHSIG = 1  # noqa: N806 (linux/prctl.h)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Proc:
    """A driver (or the floor client) in a process group of its own with its target, stopped
    (SIGSTOP) between its rounds: an idle system's threads (NIXL's and Mooncake's progress
    threads poll) would otherwise take CPU from the system being measured on 2 cores.

    Every one is resumed and ended on every way out of the bench (:meth:`end_all`: at exit,
    on SIGTERM, SIGINT and SIGHUP); a SIGKILL of the bench kills them through
    :func:`die_with_parent`."""

    live: "list[Proc]" = []

    def __init__(self, cmd, env=None):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True, preexec_fn=die_with_parent)
        Proc.live.append(self)

    def pause(self):
        os.killpg(self.p.pid, signal.SIGSTOP)

    def ask(self, line):
        os.killpg(self.p.pid, signal.SIGCONT)
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = next((x for x in self.p.stdout if x[:1] in "{0123456789."), None)
        if not out:
            sys.exit(f"{self.p.args} ended early")
        self.pause()
        return out

    def close(self):
        """Resumes the group, ends the driver by closing its input, and kills what is left of
        the group (its target) if it does not end in 30 s."""
        if self in Proc.live:
            Proc.live.remove(self)
        try:
            os.killpg(self.p.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()

    @classmethod
    def end_all(cls):
        for proc in list(cls.live):
            proc.close()


def _end_on_signal(signum, _frame):
    Proc.end_all()
    sys.exit(128 + signum)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", nargs="?", default="run")
    ap.add_argument("system", nargs="?")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block", type=int, default=16384)
    ap.add_argument("--per-request", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--prep", type=int, default=1_000_000)
    ap.add_argument("--systems", default="hmc,hmc-alloc,hmc-tcp,nixl,nixl-tcp,mooncake,memcpy,hmc-nixl,hmc-mooncake")
    ap.add_argument("--floor")
    ap.add_argument("--nixl-python")
    ap.add_argument("--mooncake-python")
    a = ap.parse_args()
    if a.role in ("target", "driver"):
        die_with_parent()  # a SIGKILL of whoever started it ends it too
    if a.role == "target":
        {"hmc": hmc_target, "hmc-tcp": hmc_target, "hmc-alloc": hmc_target, "nixl": nixl_target, "nixl-tcp": nixl_target,
         "mooncake": mooncake_target, "hmc-nixl": nixl_target, "hmc-mooncake": mooncake_target}[a.system](a)
        return
    if a.role == "driver":
        return driver(a)
    if a.role == "prep":
        return prep(a)
    pythons = {"nixl": a.nixl_python, "nixl-tcp": a.nixl_python, "mooncake": a.mooncake_python}
    systems = [s for s in a.systems.split(",") if s and (s not in pythons or pythons[s])]
    skipped = [s for s in a.systems.split(",") if s and s not in systems]
    drivers, failed = {}, []
    import atexit

    atexit.register(Proc.end_all)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _end_on_signal)
    for s in systems:
        env = dict(os.environ)
        if s == "nixl-tcp":
            env["UCX_TLS"] = "tcp"
        d = Proc([pythons.get(s) or sys.executable, HERE, "driver", s, *passthrough(a),
                  "--nixl-python", a.nixl_python or "", "--mooncake-python", a.mooncake_python or ""], env)
        if not expect(d.p.stdout, "READY"):
            # Reported and left out; the others run (its error is on stderr above).
            d.close()
            failed.append(s)
            continue
        d.pause()
        drivers[s] = d
    systems = [s for s in systems if s in drivers]
    req_bytes = a.layers * a.per_request * a.block
    floor = Proc([a.floor, "--floor-client", str(req_bytes)]) if a.floor else None
    if floor:
        floor.pause()
    res = {(s, op): [] for s in systems for op in ("read", "write")}
    rust = {(s, op): [] for s in systems for op in ("read", "write")}
    cpu = {(s, op): [] for s in systems for op in ("read", "write")}
    floor_rps = {"read": [], "write": []}
    floor_cpu = {"read": [], "write": []}
    for _ in range(a.rounds):
        for op in ("read", "write"):
            order = systems[:]
            random.shuffle(order)
            for s in order:
                r = json.loads(drivers[s].ask(f"{op} {a.seconds}"))
                res[(s, op)].append(r["rps"])
                cpu[(s, op)].append(r["cpu_s_per_gib"])
                if "rust_rps" in r:
                    rust[(s, op)].append(r["rust_rps"])
            if floor:
                # The floor's client and server (its process group), over its whole round:
                # ops as its rate times the round's length.
                pids = group_pids(floor.p.pid)
                c0, t0 = cpu_seconds(pids), time.perf_counter()
                us = float(floor.ask(f"{op} {req_bytes} {a.seconds}"))
                used, ops = cpu_seconds(pids) - c0, (time.perf_counter() - t0) / (us * 1e-6)
                floor_rps[op].append(1e6 / us)
                floor_cpu[op].append(used / (ops * req_bytes / (1 << 30)))
    for d in drivers.values():
        d.close()
    if floor:
        floor.close()
    mib = req_bytes / (1 << 20)
    say(f"\n## KV requests: {a.layers} layers x {a.blocks} blocks of {a.block} B, {a.per_request} "
        f"random blocks per layer per request ({a.layers * a.per_request} descriptors, {mib:g} MiB), "
        f"medians of {a.rounds} alternated rounds of {a.seconds} s\n")
    say("| system | op | requests/s | GB/s | CPU-s/GiB | Rust loop requests/s | Python / Rust |")
    say("|---|---|---|---|---|---|---|")
    for (s, op), xs in res.items():
        m, rm = median(xs), median(rust[(s, op)])
        say(f"| {s} | {op} | {m:.1f} | {m * req_bytes / 1e9:.2f} | {median(cpu[(s, op)]):.3f} | "
            f"{f'{rm:.1f}' if rm else '-'} | {f'{m / rm:.2f}' if rm else '-'} |")
    if floor:
        for op in ("read", "write"):
            m = median(floor_rps[op])
            say(f"| TCP floor (one {mib:g} MiB op) | {op} | {m:.1f} | {m * req_bytes / 1e9:.2f} | "
                f"{median(floor_cpu[op]):.3f} | - | - |")
    say("\nCPU-s/GiB: user and system CPU of both processes of a system (every thread), over its "
        "measured loop, per GiB moved; the floor's over its round.")
    say("\n## Ratios (medians)\n")
    med = {k: median(v) for k, v in res.items()}
    pairs = [("hmc", "nixl"), ("hmc", "memcpy"), ("hmc-alloc", "memcpy"), ("hmc-tcp", "nixl-tcp"), ("hmc-tcp", "mooncake"),
             ("hmc-nixl", "hmc"), ("hmc-mooncake", "hmc-tcp"), ("hmc-mooncake", "mooncake")]
    say("| ratio | read | write |")
    say("|---|---|---|")
    for x, y in pairs:
        if x in systems and y in systems:
            say(f"| {x} / {y} | {med[(x, 'read')] / med[(y, 'read')]:.2f} | "
                f"{med[(x, 'write')] / med[(y, 'write')]:.2f} |")
    if floor and "hmc-tcp" in systems:
        say(f"| hmc-tcp / TCP floor | {med[('hmc-tcp', 'read')] / median(floor_rps['read']):.2f} | "
            f"{med[('hmc-tcp', 'write')] / median(floor_rps['write']):.2f} |")
    say("\n## CPU per GiB, ratios of the medians\n")
    say("| ratio | read | write |")
    say("|---|---|---|")
    cmed = {k: median(v) for k, v in cpu.items()}
    if floor:
        cmed.update({("floor", op): median(floor_cpu[op]) for op in ("read", "write")})
    for x, y in [("hmc-tcp", "floor"), ("hmc", "memcpy"), ("hmc-alloc", "memcpy"), ("hmc-tcp", "nixl-tcp"), ("hmc-tcp", "mooncake"),
                 ("hmc", "nixl"), ("hmc-nixl", "hmc"), ("hmc-mooncake", "hmc-tcp")]:
        if all((z, "read") in cmed and cmed[(z, "read")] and cmed[(z, "write")] for z in (x, y)):
            say(f"| {x} / {y} | {cmed[(x, 'read')] / cmed[(y, 'read')]:.2f} | "
                f"{cmed[(x, 'write')] / cmed[(y, 'write')]:.2f} |")
    if skipped:
        say(f"\nNot run (no interpreter given for them): {', '.join(skipped)}")
    if failed:
        say(f"\nNot run (the driver did not start; its error is on stderr): {', '.join(failed)}")
    say(f"\n## Preparing {a.prep:,} block descriptors, local and remote\n")
    say("| system | entries | seconds | bytes per descriptor |")
    say("|---|---|---|---|")
    for s, py in (("hmc", sys.executable), ("hmc-nixl", sys.executable), ("nixl", a.nixl_python)):
        if not py:
            continue
        out = subprocess.run([py, HERE, "prep", s, "--prep", str(a.prep)], capture_output=True, text=True)
        rows = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if not rows:  # (an exit code alone is not a failure: NIXL's teardown may crash)
            say(f"| {s} | failed ({out.returncode}): {out.stderr.strip()[-200:]} | | |")
            continue
        r = json.loads(rows[-1])
        for kind, v in r.items():
            say(f"| {s} | {kind} | {v['secs']:.4f} | {v['bytes'] / a.prep:.2f} |")


if __name__ == "__main__":
    main()
