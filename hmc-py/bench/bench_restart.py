"""A restarted peer under NIXL's API, on NIXL 1.5.1 and on hmc.nixl in one run: how long
after the first post on a handle of the old process the failure is reported
(``nixlRemoteDisconnectError`` or ``"ERR"``), and how long ``remove_remote_agent`` +
``add_remote_agent`` of the new process's metadata + preparing and completing a READ of it
take. Rounds alternate the two packages; medians.

    python hmc-py/bench/bench_restart.py [--nixl-python PATH] [--rounds 7]

Run by ``cargo xtask bench kv`` beside the KV bench (with NIXL's venv).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZE = 1 << 20
HERE = os.path.abspath(__file__)


def target(pkg):
    """The prefill side: registers SIZE bytes, prints its metadata, waits for stdin's end."""
    import importlib

    import numpy as np

    nx = importlib.import_module(pkg + "._api")
    agent = nx.nixl_agent("prefill", nx.nixl_agent_config(backends=["UCX"]))
    buf = np.full(SIZE, 7, np.uint8)
    agent.register_memory([(buf.ctypes.data, SIZE, 0, "")], "DRAM")
    print("MD", agent.get_agent_metadata().hex(), buf.ctypes.data, flush=True)
    sys.stdin.read()
    os._exit(0)


def start(python, pkg):
    p = subprocess.Popen([python, HERE, "--target", pkg], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = next(ln for ln in p.stdout if ln.startswith("MD "))
    _, md, addr = line.split()
    return p, bytes.fromhex(md), int(addr)


def initiator(pkg, rounds):
    """Prints one JSON line: the detection and recovery times (ms) of each round."""
    import importlib

    import numpy as np

    nx = importlib.import_module(pkg + "._api")
    nb = importlib.import_module(pkg + "._bindings")
    agent = nx.nixl_agent("decode", nx.nixl_agent_config(backends=["UCX"]))
    dst = np.zeros(SIZE, np.uint8)
    agent.register_memory([(dst.ctypes.data, SIZE, 0, "")], "DRAM")
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data, SIZE, 0)], "DRAM")

    def read(rh):
        h = agent.make_prepped_xfer("READ", local, [0], rh, [0])
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        return h, st

    out = {"detect_ms": [], "recover_ms": [], "ok": True}
    p, md, addr = start(sys.executable, pkg)
    name = agent.add_remote_agent(md)
    rh = agent.prep_xfer_dlist(name, [(addr, SIZE, 0)], "DRAM")
    h, st = read(rh)
    assert st == "DONE", st
    for _ in range(rounds):
        p.kill()
        p.wait()
        p, md, addr = start(sys.executable, pkg)
        dst[:] = 0
        t0 = time.perf_counter()
        try:
            st = agent.transfer(h)
            while st == "PROC":
                st = agent.check_xfer_state(h)
        except nb.nixlRemoteDisconnectError:
            st = "DISCONNECT"
        t1 = time.perf_counter()
        out["ok"] &= st in ("ERR", "DISCONNECT") and not dst.any()
        agent.release_xfer_handle(h)
        agent.release_dlist_handle(rh)
        t2 = time.perf_counter()
        agent.remove_remote_agent(name)
        name = agent.add_remote_agent(md)
        rh = agent.prep_xfer_dlist(name, [(addr, SIZE, 0)], "DRAM")
        h, st = read(rh)
        t3 = time.perf_counter()
        out["ok"] &= st == "DONE" and bool((dst == 7).all())
        out["detect_ms"].append((t1 - t0) * 1e3)
        out["recover_ms"].append((t3 - t2) * 1e3)
    p.stdin.close()
    p.wait()
    print("RESULT", json.dumps(out), flush=True)
    os._exit(0)  # NIXL 1.5.1 crashes in its teardown here


def run(python, pkg, rounds):
    r = subprocess.run([python, HERE, "--initiator", pkg, "--rounds", str(rounds)], capture_output=True,
                       text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{pkg}: no result\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(line.split(" ", 1)[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nixl-python")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target")
    ap.add_argument("--initiator")
    a = ap.parse_args()
    if a.target:
        return target(a.target)
    if a.initiator:
        return initiator(a.initiator, a.rounds)
    systems = [("hmc.nixl", sys.executable)] + ([("nixl_cu12", a.nixl_python)] if a.nixl_python else [])
    got = {s: {"detect_ms": [], "recover_ms": [], "ok": True} for s, _ in systems}
    # Alternated: each pass runs every system once with a few rounds.
    for _ in range(a.rounds):
        for s, py in systems:
            r = run(py, s, 3)
            for k in ("detect_ms", "recover_ms"):
                got[s][k] += r[k]
            got[s]["ok"] &= r["ok"]
    n = len(got["hmc.nixl"]["detect_ms"])
    print(f"### A restarted peer (1 MiB READ, NIXL's default backend UCX on both; median ms over {n} restarts)")
    print()
    print("| system | failure reported | remove + add + first READ | checks |")
    print("| --- | ---: | ---: | --- |")
    for s, _ in systems:
        g = got[s]
        print(f"| {s} | {statistics.median(g['detect_ms']):.2f} | {statistics.median(g['recover_ms']):.2f} | "
              f"{'ok' if g['ok'] else 'FAILED'} |")
    print()
    if len(systems) == 2:
        h, x = got["hmc.nixl"], got["nixl_cu12"]
        ratio = statistics.median(h["recover_ms"]) / statistics.median(x["recover_ms"])
        print(f"recovery hmc.nixl / NIXL: {ratio:.2f} (target <= 1.00: {'met' if ratio <= 1 else 'missed'})")
    print("JSON", json.dumps(got))


if __name__ == "__main__":
    main()
