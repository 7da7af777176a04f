"""vLLM's NixlConnector sequence of NIXL calls between two processes, written against NIXL's
public API: run with ``nixl`` (NIXL itself: ``nixl_cu12``) or ``hmc.nixl`` as the package,
the only difference. Prints ``RESULT key value`` lines; ``test_nixl.py`` compares them.

    python nixl_vllm_pattern.py PACKAGE            # the decode side, which starts the prefill
    python nixl_vllm_pattern.py PACKAGE prefill    # (internal)

The sequence (vLLM's ``NixlConnectorWorker``): one region per layer registered as DRAM; the
prefill's metadata handed over a side channel (here a pipe) to ``add_remote_agent``; block
descriptors prepared once on both sides (``prep_xfer_dlist``, N x 3 arrays, and N x 5
strided); per request ``make_prepped_xfer("READ", ..., notif_msg)``, ``transfer``,
``check_xfer_state`` until ``DONE``, telemetry, ``estimate_xfer_cost``, ``release_xfer_handle``; ``get_new_notifs``
on the prefill side; ``send_notif`` heartbeats; a WRITE checked by the target's digests;
``check_remote_xfer_done``; the errors of an unknown agent and foreign metadata; teardown
(``release_dlist_handle``, ``remove_remote_agent``, ``deregister_memory``).
"""

import hashlib
import importlib
import json
import os
import subprocess
import sys
import time

import numpy as np

LAYERS, BLOCKS, BLOCK = 4, 64, 4096


def fill(layer):
    return np.random.default_rng(100 + layer).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)


def digest(b):
    return hashlib.sha256(bytes(b)).hexdigest()[:16]


def table(regions):
    base = np.repeat(np.array([r.ctypes.data for r in regions], dtype=np.int64), BLOCKS)
    offs = np.tile(np.arange(BLOCKS, dtype=np.int64) * BLOCK, len(regions))
    return np.stack([base + offs, np.full_like(base, BLOCK), np.zeros_like(base)], axis=1)


def result(key, value):
    print("RESULT", key, json.dumps(value), flush=True)


def api(pkg):
    return importlib.import_module(pkg + "._api"), importlib.import_module(pkg + "._bindings")


def prefill(pkg):
    nx, _ = api(pkg)
    backend = os.environ.get("NIXL_PATTERN_BACKEND", "UCX")
    agent = nx.nixl_agent("prefill", nx.nixl_agent_config(backends=[backend]))
    regions = [fill(i) for i in range(LAYERS)]
    agent.register_memory([(r.ctypes.data, r.nbytes, 0, "") for r in regions], "DRAM")
    print("MD", agent.get_agent_metadata().hex(), *[r.ctypes.data for r in regions], flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "notifs":  # waits up to 5 s for the first
            end, got = time.time() + 5, {}
            while not got and time.time() < end:
                got = agent.get_new_notifs()
                time.sleep(0.001)
            print("NOTIFS", json.dumps({k if isinstance(k, str) else k.decode(): [m.decode() for m in v] for k, v in got.items()}), flush=True)
        elif cmd[0] == "done":  # check_remote_xfer_done(decode, tag)
            end, found = time.time() + 5, False
            while not found and time.time() < end:
                found = agent.check_remote_xfer_done("decode", cmd[1].encode())
                time.sleep(0.001)
            print("DONE", json.dumps(found), flush=True)
        elif cmd[0] == "digest":
            items = [tuple(map(int, x.split(":"))) for x in cmd[1].split(",")]
            print("DIGESTS", *[digest(regions[lay][b * BLOCK:(b + 1) * BLOCK]) for lay, b in items], flush=True)


def ask(p, line, first):
    if line is not None:
        p.stdin.write(line + "\n")
        p.stdin.flush()
    for out in p.stdout:
        w = out.split(maxsplit=1)
        if w and w[0] == first:
            return w[1].strip() if len(w) > 1 else ""
    raise SystemExit(f"the prefill process ended before answering {line!r}")


def decode(pkg):
    nx, nb = api(pkg)
    p = subprocess.Popen([sys.executable, __file__, pkg, "prefill"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    words = ask(p, None, "MD").split()
    md, addrs = bytes.fromhex(words[0]), [int(x) for x in words[1:]]
    agent = nx.nixl_agent("decode", nx.nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    local = [np.zeros(BLOCKS * BLOCK, dtype=np.uint8) for _ in range(LAYERS)]
    reg = agent.register_memory([(r.ctypes.data, r.nbytes, 0, "") for r in local], "DRAM")
    name = agent.add_remote_agent(md)
    result("remote_name", name.decode() if isinstance(name, bytes) else name)
    result("remote_md_ok", agent.check_remote_metadata(name))

    class Remote:  # the remote layers as arrays of their addresses, for `table`
        def __init__(self, a):
            self.ctypes = type("c", (), {"data": a})

    lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", table(local), "DRAM")
    rh = agent.prep_xfer_dlist(name, table([Remote(a) for a in addrs]), "DRAM")
    rng = np.random.default_rng(7)
    fills = [fill(i) for i in range(LAYERS)]
    blk = lambda regions, e: regions[e // BLOCKS][(e % BLOCKS) * BLOCK:(e % BLOCKS + 1) * BLOCK]  # noqa: E731

    # Requests: random blocks of every layer READ with a notification, three times.
    states, ok = [], True
    for r in range(3):
        theirs = np.concatenate([i * BLOCKS + rng.choice(BLOCKS, 8, replace=False) for i in range(LAYERS)])
        ours = np.concatenate([i * BLOCKS + rng.choice(BLOCKS, 8, replace=False) for i in range(LAYERS)])
        h = agent.make_prepped_xfer("READ", lh, ours, rh, theirs, f"req-{r}".encode())
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        states.append(st)
        ok &= all(digest(blk(local, o)) == digest(blk(fills, t)) for o, t in zip(ours, theirs))
        if r == 0:
            t = agent.get_xfer_telemetry(h)
            result("telemetry", [t.totalBytes, 0 < t.descCount <= len(ours), t.xferDuration >= 0])
        if r == 2:
            d, m, method = agent.estimate_xfer_cost(h)
            # NIXL's UCX answers 0 here between processes: the figure itself is not compared.
            result("estimate", [type(d).__name__, d >= 0, type(m).__name__, m >= 0, method])
        agent.release_xfer_handle(h)
    result("read_states", states)
    result("read_bytes_ok", bool(ok))
    seen = json.loads(ask(p, "notifs", "NOTIFS"))
    while sum(len(v) for v in seen.values()) < 3:
        more = json.loads(ask(p, "notifs", "NOTIFS"))
        if not more:
            break
        for k, v in more.items():
            seen.setdefault(k, []).extend(v)
    result("prefill_notifs", {k: sorted(v) for k, v in seen.items()})

    # A heartbeat, as vLLM's keep-alive.
    agent.send_notif(name, b"heartbeat")
    result("heartbeat", json.loads(ask(p, "notifs", "NOTIFS")))

    # Strided entries: one N x 5 row per layer on each side.
    ls = agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([[r.ctypes.data, BLOCK, 0, BLOCK, BLOCKS] for r in local]), "DRAM")
    rs = agent.prep_xfer_dlist(name, np.array([[a, BLOCK, 0, BLOCK, BLOCKS] for a in addrs]), "DRAM")
    for r in local:
        r[:] = 0
    idx = list(range(0, LAYERS * BLOCKS, 5))
    h = agent.make_prepped_xfer("READ", ls, idx, rs, idx)
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    result("strided_read", [st, all(digest(blk(local, i)) == digest(blk(fills, i)) for i in idx)])
    agent.release_xfer_handle(h)

    # A WRITE of other blocks, checked by the prefill's digests and its check_remote_xfer_done.
    for i, r in enumerate(local):
        r[:] = (np.arange(r.size) * (i + 5)).astype(np.uint8)
    src, dst = [1, 70, 140, 250], [3, 66, 129, 200]
    h = agent.make_prepped_xfer("WRITE", lh, src, rh, dst, b"written-1")
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    items = ",".join(f"{d // BLOCKS}:{d % BLOCKS}" for d in dst)
    got = ask(p, f"digest {items}", "DIGESTS").split()
    result("write", [st, got == [digest(blk(local, s)) for s in src]])
    result("remote_xfer_done", json.loads(ask(p, "done written", "DONE")))
    agent.release_xfer_handle(h)

    # Errors, by class name.
    try:
        agent.prep_xfer_dlist("nobody", table(local), "DRAM")
        result("unknown_agent", None)
    except Exception as e:  # noqa: BLE001
        result("unknown_agent", type(e).__name__)
    try:
        agent.add_remote_agent(b"not metadata")
        result("garbage_md", None)
    except Exception as e:  # noqa: BLE001
        result("garbage_md", type(e).__name__)
    result("exceptions_exist", [hasattr(nb, n) for n in ("nixlBackendError", "nixlCancelledError", "nixlRemoteDisconnectError", "nixlNotFoundError")])
    result("statuses", [int(nb.NIXL_SUCCESS), int(nb.NIXL_IN_PROG), int(nb.NIXL_ERR_NOT_FOUND)])

    # Teardown.
    for x in (lh, rh, ls, rs):
        agent.release_dlist_handle(x)
    agent.remove_remote_agent(name)
    result("after_remove", agent.check_remote_metadata(name))
    agent.deregister_memory(reg)
    p.stdin.close()
    p.wait(30)
    result("end", "ok")


if __name__ == "__main__":
    pkg = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "prefill":
        prefill(pkg)
    else:
        decode(pkg)
