"""NIXL's loopback: an agent whose own name is the remote side of a prepared list
(``prep_xfer_dlist(agent.name, ...)``), written against NIXL's public API; run with
``nixl_cu12`` (NIXL itself) or ``hmc.nixl`` as the package. Prints ``RESULT`` lines;
``test_nixl.py`` compares them.

    python nixl_loopback.py PACKAGE
"""

import hashlib
import importlib
import json
import os
import sys
import time

import numpy as np


def result(key, value):
    print("RESULT", key, json.dumps(value), flush=True)


def done(agent, h):
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    return st


def notifs(agent, want):
    end, got = time.time() + 10, {}
    while sum(len(v) for v in got.values()) < want and time.time() < end:
        for k, v in agent.get_new_notifs().items():
            got.setdefault(k, []).extend(m.decode() for m in v)
    return got


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


def main():
    pkg = sys.argv[1]
    nx = importlib.import_module(pkg + "._api")
    agent = nx.nixl_agent("self", nx.nixl_agent_config(backends=["UCX"]))
    blk = 4096
    src = np.random.default_rng(5).integers(0, 256, 16 * blk, dtype=np.uint8)
    dst = np.zeros(16 * blk, np.uint8)
    agent.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    result("own_metadata", agent.check_remote_metadata("self"))
    # Registered after the agent first named itself: still reachable through loopback.
    agent.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data + i * blk, blk, 0) for i in range(16)], "DRAM")
    mine = agent.prep_xfer_dlist("self", [(src.ctypes.data + i * blk, blk, 0) for i in range(16)], "DRAM")
    h = agent.make_prepped_xfer("READ", local, [0, 1, 2, 3], mine, [3, 2, 1, 0], b"loop")
    st = done(agent, h)
    same = all(digest(dst[i * blk:(i + 1) * blk]) == digest(src[(3 - i) * blk:(4 - i) * blk]) for i in range(4))
    result("prepped_read", [st, same, bool((dst[4 * blk:] == 0).all())])
    result("notifs", notifs(agent, 1))
    agent.release_xfer_handle(h)
    w = agent.initialize_xfer(
        "WRITE",
        agent.get_xfer_descs([(src.ctypes.data, 1024, 0)], "DRAM"),
        agent.get_xfer_descs([(dst.ctypes.data + 60000, 1024, 0)], "DRAM"),
        "self",
        b"w",
    )
    result("write", [done(agent, w), bool((dst[60000:61024] == src[:1024]).all())])
    result("write_notifs", notifs(agent, 1))
    agent.release_xfer_handle(w)
    other = np.zeros(64, np.uint8)  # never registered
    try:
        agent.prep_xfer_dlist("self", [(other.ctypes.data, 64, 0)], "DRAM")
        result("unregistered", None)
    except Exception as e:  # noqa: BLE001
        result("unregistered", type(e).__name__)
    agent.send_notif("self", b"to myself")
    result("send_notif", notifs(agent, 1))
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(mine)
    result("end", "ok")
    if not pkg.startswith("hmc."):
        os._exit(0)  # NIXL 1.5.1 crashes in its teardown here


if __name__ == "__main__":
    main()
