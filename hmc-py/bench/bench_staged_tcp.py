"""READ of N bytes from a target's device region vs from its host region, over tcp
loopback (or over ucx: a UCX without CUDA support stages the device region over its control
connection); alternated, medians. On this project's CI machines the device is the CUDA driver
shim (device copies are memcpy), so the ratio measures the staging path's overhead on
shared CPUs, not a GPU.

    gcc -shared -fPIC -O2 -pthread -I hmc-testshim/shim hmc-backend-cuda/tests/shim/cuda_shim.c \
        -o /tmp/shim/libcuda.so && ln -sf libcuda.so /tmp/shim/libcuda.so.1
    target/py-venv/bin/python hmc-py/bench/bench_staged_tcp.py /tmp/shim [bytes] [tcp|ucx]

Over ucx both processes run with UCX_TLS=tcp unless UCX_TLS is set, so the host region's
READ goes through UCX's TCP transport, like for like with the staged one.

Beside each rate, the CPU of both processes (``_cpu``: user and system, every thread) over the
measured READs of that kind, per GiB moved.
"""
import json, os, statistics, subprocess, sys, textwrap, time
import hmc
from _cpu import cpu_seconds, per_gib

N = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
TRANSPORT = sys.argv[3] if len(sys.argv) > 3 else "tcp"
if TRANSPORT == "ucx":
    os.environ.setdefault("UCX_TLS", "tcp")
REPS = 7
shim = sys.argv[1]
CHILD = textwrap.dedent("""
    import ctypes, json, sys
    import hmc
    cu = ctypes.CDLL("libcuda.so")
    assert cu.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cu.cuDeviceGet(ctypes.byref(dev), 0); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
    n, transport = int(sys.argv[1]), sys.argv[2]
    p = ctypes.c_ulonglong(); assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    ctypes.memset(p.value, 7, n)
    host = bytearray(b"\\x07" * n)
    e = hmc.Engine(); e.initialize("127.0.0.1:0", {"transport": transport})
    hd = e.register_mem((p.value, n), hmc.MemType.DEVICE, device="cuda:0")
    hh = e.register_mem(host)
    print(json.dumps({"addr": e.local_address, "dev": hd.addr, "host": hh.addr}), flush=True)
    sys.stdin.readline()
""")
child = subprocess.Popen([sys.executable, "-c", CHILD, str(N), TRANSPORT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "LD_LIBRARY_PATH": shim})
info = json.loads(child.stdout.readline())
buf = bytearray(N)
e = hmc.Engine(); e.initialize("127.0.0.1:0", {"transport": TRANSPORT})
h = e.register_mem(buf)
e.connect(info["addr"], 5000)
times = {"host": [], "dev": []}
cpu = {"host": 0.0, "dev": 0.0}
pids = [os.getpid(), child.pid]
for i in range(REPS + 1):
    for kind in ("host", "dev") if i % 2 == 0 else ("dev", "host"):
        c, t = cpu_seconds(pids), time.perf_counter()
        e.transfer_sync(info["addr"], hmc.TransferOp.READ, [(h.addr, info[kind], N)], timeout_ms=60_000)
        dt, dc = time.perf_counter() - t, cpu_seconds(pids) - c
        if i > 0:  # the first round warms up connections and chunk pools
            times[kind].append(dt)
            cpu[kind] += dc
gbps = {k: N / statistics.median(v) / 1e9 for k, v in times.items()}
cpu_gib = {k: per_gib(v, N * REPS) for k, v in cpu.items()}
print(json.dumps({"transport": TRANSPORT, "bytes": N, "reps": REPS, "host_GBps": round(gbps["host"], 2), "device_GBps": round(gbps["dev"], 2),
                  "ratio": round(gbps["dev"] / gbps["host"], 2),
                  "host_cpu_s_per_gib": round(cpu_gib["host"], 3), "device_cpu_s_per_gib": round(cpu_gib["dev"], 3)}))
child.stdin.write("x\n"); child.stdin.flush(); child.wait()
e.finalize()
