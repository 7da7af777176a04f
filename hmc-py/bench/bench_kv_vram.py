"""The KV pattern of ``cargo xtask bench kv`` on VRAM (issue 38's GPU targets), for a GPU
machine: a prefill process holds one device region per layer, a decode process READs
``--per-request`` random blocks of every layer per request into its own device regions,
with prepared lists on both sides. Requests per second and CPU-seconds per GiB moved
(``_cpu.py``: user and system CPU of the driver and its target, every thread), two
processes on one host, all systems in one run, rounds alternated, medians.

Systems:

- ``cumemcpy``: the same blocks copied device to device in one process
  (``cuMemcpyDtoDAsync`` per block, one ``cuStreamSynchronize`` per request): the
  baseline of the one-host target (hmc-ipc >= 80% of it);
- ``hmc-ipc``: hmc over ``transport=shm``: the prefill's VRAM opened by vendor IPC, one
  device copy per block, no host bounce;
- ``hmc-tcp``: hmc over ``transport=tcp``, VRAM on both sides: GPU to host to GPU, the
  target staging through pinned chunks;
- ``hmc-tcp-host``: the same over host memory on both sides: the baseline of the TCP
  target (hmc-tcp >= 80% of it);
- ``nixl``: NIXL 1.5.1 (``nixl-cu12``), VRAM on both sides, its default transports
  (UCX, with ``cuda_ipc`` where it finds it): hmc-ipc's peer (>= NIXL's requests/s).
  Left out, with the reason, where ``nixl_cu12`` does not import or start.

Device memory is allocated with the CUDA driver API through ``ctypes`` (no torch needed).
Bytes are checked on each system's first request against the prefill's fill.

    python bench_kv_vram.py [--rounds N] [--seconds S] [--systems a,b] [--device N]
                            [--layers L --blocks B --block BYTES --per-request K]

It also runs against the project's CUDA driver shim (``LD_LIBRARY_PATH`` holding it as
``libcuda.so``), where every "device" copy is a memcpy: that checks the script, not a GPU.
"""

import argparse
import ctypes
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from _cpu import cpu_seconds, per_gib

HERE = os.path.abspath(__file__)
SYSTEMS = ["cumemcpy", "hmc-ipc", "hmc-tcp", "hmc-tcp-host", "nixl"]


def say(*words):
    print(*words, flush=True)


def expect(stream, first):
    """The next line whose first word is ``first`` (libraries may log to stdout too)."""
    for line in stream:
        w = line.split()
        if w and w[0] == first:
            return w
    return None


class Cuda:
    """The few driver calls this bench needs, on device ``ordinal``'s primary context."""

    def __init__(self, ordinal):
        self.cu = ctypes.CDLL("libcuda.so.1" if os.path.exists("/dev/nvidia0") else "libcuda.so")
        self.ok(self.cu.cuInit(0), "cuInit")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.ok(self.cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self.ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ok(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.stream = ctypes.c_void_p()
        self.ok(self.cu.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")  # non-blocking

    @staticmethod
    def ok(status, what):
        if status != 0:
            sys.exit(f"{what} failed with CUDA status {status}")

    def alloc(self, n):
        p = ctypes.c_ulonglong()
        self.ok(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
        return p.value

    def upload(self, dst, data):
        self.ok(self.cu.cuMemcpyHtoDAsync_v2(ctypes.c_ulonglong(dst), data, ctypes.c_size_t(len(data)),
                                             self.stream), "cuMemcpyHtoDAsync")
        self.sync()

    def download(self, src, n):
        out = ctypes.create_string_buffer(n)
        self.ok(self.cu.cuMemcpyDtoHAsync_v2(out, ctypes.c_ulonglong(src), ctypes.c_size_t(n), self.stream),
                "cuMemcpyDtoHAsync")
        self.sync()
        return out.raw

    def copy(self, dst, src, n):
        self.ok(self.cu.cuMemcpyDtoDAsync_v2(ctypes.c_ulonglong(dst), ctypes.c_ulonglong(src),
                                             ctypes.c_size_t(n), self.stream), "cuMemcpyDtoDAsync")

    def sync(self):
        self.ok(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


def fill(layer, n):
    import numpy as np

    i = np.arange(n, dtype=np.uint64)
    return (((i * 7 + layer * 13) ^ (i >> 9)) & 0xFF).astype(np.uint8).tobytes()


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def on_host(system):
    return system == "hmc-tcp-host"


def table(addrs, blocks, block):
    import numpy as np

    base = np.repeat(np.array(addrs, dtype=np.int64), blocks)
    offs = np.tile(np.arange(blocks, dtype=np.int64) * block, len(addrs))
    return np.stack([base + offs, np.full_like(base, block), np.zeros_like(base)], axis=1)


def regions(a, cuda, filled):
    """``a.layers`` regions of ``a.blocks * a.block`` bytes: device memory, or host memory
    for ``hmc-tcp-host``; (addresses, what keeps host ones alive)."""
    import numpy as np

    n = a.blocks * a.block
    if on_host(a.system):
        bufs = [np.frombuffer(bytearray(fill(i, n) if filled else bytes(n)), dtype=np.uint8)
                for i in range(a.layers)]
        return [b.ctypes.data for b in bufs], bufs
    addrs = [cuda.alloc(n) for _ in range(a.layers)]
    for i, p in enumerate(addrs):
        cuda.upload(p, fill(i, n) if filled else bytes(n))
    return addrs, None


def hmc_engine(a):
    import hmc

    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {"transport": "shm" if a.system == "hmc-ipc" else "tcp"})
    return hmc, e


def register_hmc(hmc, e, a, addrs, keep):
    n = a.blocks * a.block
    for i, p in enumerate(addrs):
        if keep is not None:
            e.register_mem(keep[i])
        else:
            e.register_mem((p, n), hmc.MemType.DEVICE, device=f"cuda:{a.device}")


def target(a):
    cuda = Cuda(a.device)
    addrs, keep = regions(a, cuda, filled=True)
    if a.system.startswith("hmc"):
        hmc, e = hmc_engine(a)
        register_hmc(hmc, e, a, addrs, keep)
        say("READY", e.local_metadata().hex(), *addrs)
        sys.stdin.readline()
        e.finalize()
    else:
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        agent = nixl_agent("prefill", nixl_agent_config(backends=["UCX"]))
        agent.register_memory([(p, a.blocks * a.block, a.device, "") for p in addrs], "VRAM")
        say("READY", agent.get_agent_metadata().hex(), *addrs)
        agent.add_remote_agent(bytes.fromhex(sys.stdin.readline().strip()))
        say("OK")
        sys.stdin.readline()


def requests(a, n, seed):
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


def driver(a):
    cuda = Cuda(a.device)
    reqs = requests(a, 64, 7)
    at = lambda addrs, e: addrs[e // a.blocks] + (e % a.blocks) * a.block  # noqa: E731
    local, keep = regions(a, cuda, filled=False)
    proc = None
    if a.system == "cumemcpy":
        src, _ = regions(a, cuda, filled=True)
        remote = src

        def run(req):
            for o, t in zip(req[0].tolist(), req[1].tolist()):
                cuda.copy(at(local, o), at(src, t), a.block)
            cuda.sync()

    else:
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, HERE, "target", a.system, *passthrough(a)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        w = expect(proc.stdout, "READY")
        if not w:
            say("SKIP", f"{a.system}: the target did not start")
            return
        blob, remote = bytes.fromhex(w[1]), [int(x) for x in w[2:]]
        if a.system.startswith("hmc"):
            hmc, e = hmc_engine(a)
            register_hmc(hmc, e, a, local, keep)
            peer = e.add_remote(blob)
            ll = e.prepare_local(table(local, a.blocks, a.block))
            rl = e.prepare_remote(peer, table(remote, a.blocks, a.block))

            def run(req):
                x = e.make_transfer(hmc.TransferOp.READ, ll, req[0], rl, req[1], notif_msg=b"req")
                x.post()
                if x.wait() != hmc.TransferStatus.COMPLETED:
                    sys.exit(f"{a.system}: {x.error()}")
                x.release()

        else:
            from nixl_cu12._api import nixl_agent, nixl_agent_config

            agent = nixl_agent("decode", nixl_agent_config(backends=["UCX"]))
            agent.register_memory([(p, a.blocks * a.block, a.device, "") for p in local], "VRAM")
            name = agent.add_remote_agent(blob)
            proc.stdin.write(agent.get_agent_metadata().hex() + "\n")
            proc.stdin.flush()
            expect(proc.stdout, "OK")
            t = lambda addrs: [(int(r[0]), int(r[1]), a.device) for r in table(addrs, a.blocks, a.block)]  # noqa: E731
            lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", t(local), "VRAM")
            rh = agent.prep_xfer_dlist(name, t(remote), "VRAM")

            def run(req):
                h = agent.make_prepped_xfer("READ", lh, req[0].tolist(), rh, req[1].tolist(), b"req")
                state = agent.transfer(h)
                while state != "DONE":
                    if state == "ERR":
                        sys.exit("nixl READ failed")
                    state = agent.check_xfer_state(h)
                agent.release_xfer_handle(h)

    # The first request's bytes, against the prefill's fill.
    run(reqs[0])
    n = a.blocks * a.block
    fills = [fill(i, n) for i in range(a.layers)]
    for o, t in zip(reqs[0][0].tolist(), reqs[0][1].tolist()):
        got = (bytes(keep[o // a.blocks][(o % a.blocks) * a.block:][:a.block]) if keep is not None
               else cuda.download(at(local, o), a.block))
        want = fills[t // a.blocks][(t % a.blocks) * a.block:][:a.block]
        if digest(got) != digest(want):
            sys.exit(f"{a.system}: block {o} differs from the prefill's block {t} on the first request")
    say("READY")
    pids = [os.getpid()] + ([proc.pid] if proc else [])
    for line in sys.stdin:
        seconds = float(line)
        k, t0, c0 = 0, time.perf_counter(), cpu_seconds(pids)
        while time.perf_counter() - t0 < seconds or k < 3:
            run(reqs[k % len(reqs)])
            k += 1
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pids) - c0
        moved = k * a.layers * a.per_request * a.block
        say("RESULT", json.dumps({"rps": k / elapsed, "cpu_s_per_gib": per_gib(cpu, moved)},
                                 separators=(",", ":")))
    if proc:
        proc.stdin.write("bye\n")
        proc.stdin.flush()
        proc.wait(30)


def passthrough(a):
    return ["--layers", str(a.layers), "--blocks", str(a.blocks), "--block", str(a.block),
            "--per-request", str(a.per_request), "--device", str(a.device)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", nargs="?", default="bench", choices=["bench", "driver", "target"])
    p.add_argument("system", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--block", type=int, default=32 << 10)
    p.add_argument("--per-request", type=int, default=16)
    a = p.parse_args()
    if a.role == "target":
        return target(a)
    if a.role == "driver":
        return driver(a)
    drivers, skipped = {}, {}
    for s in a.systems.split(","):
        d = subprocess.Popen([sys.executable, HERE, "driver", s, *passthrough(a)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        w = expect(d.stdout, "READY") if s != "nixl" else None
        if s == "nixl":
            # NIXL may not start here (no CUDA-capable UCX): say why and go on.
            for line in d.stdout:
                if line.startswith("READY") or line.startswith("SKIP"):
                    w = line.split(maxsplit=1)
                    break
            if not w or w[0] != "READY":
                skipped[s] = w[1].strip() if w else f"exited with status {d.wait()}"
                d.kill()
                continue
        if not w:
            sys.exit(f"{s}: the driver did not start (status {d.wait()})")
        drivers[s] = d
    rps = {s: [] for s in drivers}
    cpu = {s: [] for s in drivers}
    for r in range(a.rounds):
        order = list(drivers) if r % 2 == 0 else list(reversed(drivers))
        for s in order:
            drivers[s].stdin.write(f"{a.seconds}\n")
            drivers[s].stdin.flush()
            res = json.loads(expect(drivers[s].stdout, "RESULT")[1])
            rps[s].append(res["rps"])
            cpu[s].append(res["cpu_s_per_gib"])
    for d in drivers.values():
        d.stdin.close()
        d.wait(60)
    med = {s: statistics.median(v) for s, v in rps.items()}
    ratio = lambda x, y: round(med[x] / med[y], 2) if x in med and y in med else None  # noqa: E731
    report = {
        "pattern": {"layers": a.layers, "blocks": a.blocks, "block": a.block, "per_request": a.per_request,
                    "rounds": a.rounds, "seconds": a.seconds},
        "rps": {s: round(v, 1) for s, v in med.items()},
        "cpu_s_per_gib": {s: round(statistics.median(v), 3) for s, v in cpu.items()},
        "targets": {
            "hmc-ipc / cumemcpy (>= 0.80)": ratio("hmc-ipc", "cumemcpy"),
            "hmc-ipc / nixl (>= 1.00)": ratio("hmc-ipc", "nixl"),
            "hmc-tcp / hmc-tcp-host (>= 0.80)": ratio("hmc-tcp", "hmc-tcp-host"),
        },
        "skipped": skipped,
    }
    say(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
