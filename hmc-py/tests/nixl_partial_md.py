"""The flow of NIXL's ``examples/python/partial_md_example.py``, written against NIXL's
public API: a target registers memory in two steps and hands each over as partial
metadata; the initiator waits for ``check_remote_metadata(name, descs)`` and READs it with
checksums; the target invalidates its metadata (the initiator sees it go) and sends it
again (the initiator has it again). Run with ``nixl_cu12`` or ``hmc.nixl``, through etcd
(``NIXL_ETCD_ENDPOINTS`` set: labelled partial metadata the initiator fetches) or the
listen threads (without it: the target sends to the initiator's ``ip_addr:port``).
Prints ``RESULT`` lines.

    python nixl_partial_md.py PACKAGE            # the initiator; starts the target
"""

import hashlib
import importlib
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

ETCD = bool(os.environ.get("NIXL_ETCD_ENDPOINTS"))

SIZE = 1 << 16


def result(key, value):
    print("RESULT", key, json.dumps(value), flush=True)


def fill(i):
    return np.random.default_rng(100 + i).integers(0, 256, SIZE, dtype=np.uint8)


def until(f, within=20.0):
    end = time.time() + within
    while time.time() < end:
        if f():
            return True
        time.sleep(0.01)
    return False


def target(nx, peer_port):
    agent = nx.nixl_agent("target", nx.nixl_agent_config(backends=["UCX"]))
    to = {} if ETCD else {"ip_addr": "127.0.0.1", "port": peer_port}
    bufs = [fill(0), fill(1)]
    for i, label in enumerate(["part-1", "part-2"]):
        cmd = sys.stdin.readline().strip()
        assert cmd == f"publish {i}", cmd
        reg = agent.register_memory([(bufs[i].ctypes.data, SIZE, 0, "")], "DRAM")
        agent.send_partial_agent_metadata(reg, i == 0, ["UCX"], label=label, **to)
        print("PUBLISHED", i, bufs[i].ctypes.data, flush=True)
    for cmd in sys.stdin:
        cmd = cmd.strip()
        if cmd == "invalidate":
            agent.invalidate_local_metadata(**to)
        elif cmd == "send":
            agent.send_local_metadata(**to)
        elif cmd == "quit":
            break
        print("OK", cmd, flush=True)
    os._exit(0)


def main():
    pkg = sys.argv[1]
    nx = importlib.import_module(pkg + "._api")
    if len(sys.argv) > 2:
        return target(nx, int(sys.argv[3]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen([sys.executable, __file__, pkg, "target", str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def ask(cmd, want):
        child.stdin.write(cmd + "\n")
        child.stdin.flush()
        return next(line for line in child.stdout if line.startswith(want)).split()

    conf = nx.nixl_agent_config(backends=["UCX"]) if ETCD else nx.nixl_agent_config(True, True, port)
    agent = nx.nixl_agent("initiator", conf)
    local = np.zeros(SIZE, np.uint8)
    agent.register_memory([(local.ctypes.data, SIZE, 0, "")], "DRAM")

    def read(addr):
        local[:] = 0
        h = agent.initialize_xfer("READ", agent.get_xfer_descs([(local.ctypes.data, SIZE, 0)], "DRAM"),
                                  agent.get_xfer_descs([(addr, SIZE, 0)], "DRAM"), "target")
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        agent.release_xfer_handle(h)
        return st

    addrs = []
    for i, label in enumerate(["part-1", "part-2"]):
        addr = int(ask(f"publish {i}", "PUBLISHED")[2])
        addrs.append(addr)
        descs = agent.get_xfer_descs([(addr, SIZE, 0)], "DRAM")
        if ETCD:
            agent.fetch_remote_metadata("target", label=label)
        result(f"{label}_loaded", until(lambda: agent.check_remote_metadata("target", descs)))
        result(f"{label}_read", [read(addr), hashlib.sha256(local).hexdigest() == hashlib.sha256(fill(i)).hexdigest()])
    ask("invalidate", "OK")
    result("invalidated", until(lambda: not agent.check_remote_metadata("target")))
    ask("send", "OK")
    if ETCD:
        agent.fetch_remote_metadata("target")
    result("sent_again", until(lambda: agent.check_remote_metadata("target")))
    result("read_again", [read(addrs[1]), bool((local == fill(1)).all())])
    child.stdin.write("quit\n")
    child.stdin.close()
    child.wait(timeout=20)
    result("end", "ok")
    if not pkg.startswith("hmc."):
        os._exit(0)


if __name__ == "__main__":
    main()
