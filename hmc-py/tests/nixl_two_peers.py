"""The flow of NIXL's ``examples/python/basic_two_peers.py`` (a target and an initiator that
find each other through their listen threads), written against NIXL's public API: run
with ``nixl`` (``nixl_cu12``) or ``hmc.nixl`` as the package. Prints ``RESULT`` lines.

    python nixl_two_peers.py PACKAGE        # the initiator; starts the target
    python nixl_two_peers.py PACKAGE target PORT
"""

import importlib
import json
import socket
import subprocess
import sys
import time

import numpy as np


def result(key, value):
    print("RESULT", key, json.dumps(value), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    pkg, role = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "initiator"
    nx = importlib.import_module(pkg + "._api")
    if role == "initiator":
        port = free_port()
        child = subprocess.Popen([sys.executable, __file__, pkg, "target", str(port)], stdout=subprocess.PIPE, text=True)
        assert next(line for line in child.stdout if line.startswith("LISTENING"))
        conf = nx.nixl_agent_config(True, True, 0)
    else:
        port = int(sys.argv[3])
        conf = nx.nixl_agent_config(True, True, port)
    agent = nx.nixl_agent(role, conf)
    buf = np.full(1 << 16, 0xAB if role == "target" else 0, dtype=np.uint8)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    descs = reg.trim()
    if role == "target":
        print("LISTENING", flush=True)
        while not agent.check_remote_metadata("initiator"):
            time.sleep(0.001)
        agent.send_notif("initiator", agent.get_serialized_descs(descs))
        end = time.time() + 20
        while not agent.check_remote_xfer_done("initiator", b"UUID") and time.time() < end:
            time.sleep(0.001)
        # The initiator's invalidate_local_metadata drops its metadata here.
        end = time.time() + 20
        while agent.check_remote_metadata("initiator") and time.time() < end:
            time.sleep(0.001)
        print("TARGET_DONE", flush=True)
        return
    agent.fetch_remote_metadata("target", "127.0.0.1", port)
    agent.send_local_metadata("127.0.0.1", port)
    end, notifs = time.time() + 20, {}
    while not notifs.get("target") and time.time() < end:
        notifs = agent.get_new_notifs()
    target_descs = agent.deserialize_descs(notifs["target"][0])
    while not agent.check_remote_metadata("target"):
        time.sleep(0.001)
    result("metadata_ready", True)
    h = agent.initialize_xfer("READ", descs, target_descs, "target", "UUID")
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    result("state", st)
    result("bytes", bool((buf == 0xAB).all()))
    agent.release_xfer_handle(h)
    agent.remove_remote_agent("target")
    agent.invalidate_local_metadata("127.0.0.1", port)
    out = [line.strip() for line in child.stdout]
    result("target_saw_invalidate", "TARGET_DONE" in out)
    child.wait(30)
    result("end", "ok")


if __name__ == "__main__":
    main()
