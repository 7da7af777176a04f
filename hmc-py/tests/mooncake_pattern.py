"""Mooncake Transfer Engine's Python calls between two processes, written against its
public API (``docs/source/api-reference/python/transfer-engine.md``): run with
``mooncake.engine`` (Mooncake itself) or ``hmc.mooncake`` as the module, the only
difference. Prints ``RESULT key value`` lines; ``test_mooncake.py`` compares them.

    python mooncake_pattern.py MODULE            # the initiator, which starts the target
    python mooncake_pattern.py MODULE target     # (internal)

The calls, as SGLang's and vLLM's Mooncake wrappers make them: ``initialize`` with
``P2PHANDSHAKE`` over tcp, ``get_rpc_port`` for the session name ``host:port``,
``register_memory``/``batch_register_memory``, ``transfer_sync_read/write``,
``batch_transfer_sync_read/write``, ``batch_transfer_async_*`` with
``get_batch_transfer_status``, ``transfer_submit_write`` with ``transfer_check_status``,
``batch_transfer_sync``/``batch_transfer_async`` with an opcode, a second engine through
``initialize_ext`` with ``send_probe``, ``get_local_topology`` and batch (un)registration,
managed buffers (``allocate_managed_buffer``, ``write_bytes_to_buffer``,
``read_bytes_from_buffer``, ``get_first_buffer_address``), notifications, and the return
codes of failures (an unregistered peer range, an unknown session).
"""

import ctypes
import hashlib
import importlib
import json
import sys
import time

import numpy as np

N = 1 << 20


def result(key, value):
    print("RESULT", key, json.dumps(value), flush=True)


def fill():
    return np.random.default_rng(5).integers(0, 256, N, dtype=np.uint8)


def digest(addr, n):
    return hashlib.sha256(ctypes.string_at(addr, n)).hexdigest()[:16]


def target(mod):
    m = importlib.import_module(mod)
    te = m.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = fill()
    te.register_memory(buf.ctypes.data, N)
    print("READY", f"127.0.0.1:{te.get_rpc_port()}", buf.ctypes.data, flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            break
        if cmd[0] == "digest":
            print("DIGEST", digest(buf.ctypes.data + int(cmd[1]), int(cmd[2])), flush=True)
        elif cmd[0] == "notifies":
            end, got = time.time() + 5, []
            while not got and time.time() < end:
                got = te.get_notifies()
                time.sleep(0.005)
            print("NOTIFIES", json.dumps(sorted([n.name, n.msg] for n in got)), flush=True)


def ask(p, line, first):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    for out in p.stdout:
        w = out.split(maxsplit=1)
        if w and w[0] == first:
            return w[1].strip() if len(w) > 1 else ""
    raise SystemExit(f"the target ended before answering {line!r}")


def initiator(mod):
    import subprocess

    m = importlib.import_module(mod)
    p = subprocess.Popen([sys.executable, __file__, mod, "target"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    for out in p.stdout:
        if out.startswith("READY"):
            _, session, raddr = out.split()
            raddr = int(raddr)
            break
    te = m.TransferEngine()
    result("initialize", te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
    result("rpc_port", te.get_rpc_port() > 0)
    want = fill()
    local = np.zeros(N, dtype=np.uint8)
    la = local.ctypes.data
    result("register", te.register_memory(la, N))

    result("sync_read", te.transfer_sync_read(session, la, raddr, 65536))
    result("sync_read_bytes", bool((local[:65536] == want[:65536]).all()))
    local[:] = 7
    result("sync_write", te.transfer_sync_write(session, la + 4096, raddr + 8192, 4096))
    result("sync_write_bytes", ask(p, "digest 8192 4096", "DIGEST") == digest(la + 4096, 4096))

    offs = [0, 100_000, 300_000, 777_777]
    local[:] = 0
    result("batch_read", te.batch_transfer_sync_read(session, [la + o for o in offs], [raddr + o for o in offs], [1000] * 4))
    result("batch_read_bytes", all((local[o:o + 1000] == want[o:o + 1000]).all() for o in offs))
    local[:] = 9
    result("batch_write", te.batch_transfer_sync_write(session, [la + o for o in offs], [raddr + o + 1 for o in offs], [500] * 4))
    result("batch_write_bytes", all(ask(p, f"digest {o + 1} 500", "DIGEST") == digest(la + o, 500) for o in offs))

    local[:] = 0
    bid = te.batch_transfer_async_read(session, [la], [raddr + 2048], [4096])
    result("async_batch_id", bid != 0)
    end, st = time.time() + 10, None
    while time.time() < end:
        st = te.get_batch_transfer_status([bid])
        if st != 1:  # 1: still running (Mooncake's convention), 0 done, negative failed
            break
        time.sleep(0.001)
    result("async_status", st)
    result("async_bytes", bool((local[:4096] == want[2048:2048 + 4096]).all()))

    local[:] = 3
    bid = te.transfer_submit_write(session, la, raddr + 500_000, 2048)
    end, st = time.time() + 10, None
    while time.time() < end:
        st = te.transfer_check_status(bid)
        if st != 0:  # 0: pending, 1: done, negative: failed (Mooncake's convention)
            break
        time.sleep(0.001)
    result("submit_status", st)
    result("submit_bytes", ask(p, "digest 500000 2048", "DIGEST") == digest(la, 2048))

    op = m.TransferOpcode.Write
    result("sync_with_notify", te.transfer_sync(session, la, raddr, 128, op, m.TransferNotify("kv", "req-1")))
    result("notifies", json.loads(ask(p, "notifies", "NOTIFIES")))

    # The opcode forms, with and without a notification, and an async WRITE.
    local[:] = 0
    result("batch_sync_opcode", te.batch_transfer_sync(session, [la, la + 8192], [raddr + 600_000, raddr + 700_000],
                                                       [4096, 4096], m.TransferOpcode.Read, m.TransferNotify("kv", "req-2")))
    result("batch_sync_opcode_bytes", bool((local[:4096] == want[600_000:604_096]).all()
                                           and (local[8192:12288] == want[700_000:704_096]).all()))
    result("batch_notifies", json.loads(ask(p, "notifies", "NOTIFIES")))

    def settle(bid):
        end, st = time.time() + 10, None
        while time.time() < end:
            st = te.get_batch_transfer_status([bid])
            if st != 1:
                break
            time.sleep(0.001)
        return st

    local[:] = 5
    bid = te.batch_transfer_async(session, [la], [raddr + 800_000], [3000], m.TransferOpcode.Write)
    result("async_opcode", [bid != 0, settle(bid)])
    result("async_opcode_bytes", ask(p, "digest 800000 3000", "DIGEST") == digest(la, 3000))
    local[:] = 6
    bid = te.batch_transfer_async_write(session, [la], [raddr + 900_000], [1500])
    result("async_write", [bid != 0, settle(bid)])
    result("async_write_bytes", ask(p, "digest 900000 1500", "DIGEST") == digest(la, 1500))

    # A second engine through initialize_ext, probing the target.
    te2 = m.TransferEngine()
    result("initialize_ext", te2.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p"))
    result("send_probe", te2.send_probe(session))
    result("topology_is_json", isinstance(json.loads(te2.get_local_topology()), dict))
    # Batch (un)registration.
    extra = [np.zeros(4096, np.uint8) for _ in range(2)]
    result("batch_register", te.batch_register_memory([x.ctypes.data for x in extra], [4096, 4096]))
    result("batch_register_read", te.batch_transfer_sync_read(session, [x.ctypes.data for x in extra],
                                                              [raddr + 200_000, raddr + 204_096], [4096, 4096]))
    result("batch_register_bytes", bool((extra[0] == want[200_000:204_096]).all() and (extra[1] == want[204_096:208_192]).all()))
    result("batch_unregister", te.batch_unregister_memory([x.ctypes.data for x in extra]))

    # Managed buffers.
    mb = te.allocate_managed_buffer(4096)
    result("managed_nonzero", mb != 0)
    result("write_bytes", te.write_bytes_to_buffer(mb, b"hello mooncake", 14))
    result("read_bytes", te.read_bytes_from_buffer(mb, 14).decode())
    result("free_managed", te.free_managed_buffer(mb, 4096))

    # Failures: a peer range never registered, an unknown session.
    bad = te.transfer_sync_read(session, la, raddr + 2 * N + 4096, 4096)
    result("unregistered_peer_range", bad < 0)
    result("unknown_session", te.transfer_sync_read("127.0.0.1:1", la, raddr, 4096))
    result("async_to_unknown_session", te.batch_transfer_async_read("127.0.0.1:1", [la], [raddr], [16]))
    result("unregister", [te.unregister_memory(la), te.unregister_memory(la)])
    p.stdin.close()
    p.wait(30)
    result("end", "ok")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "target":
        target(sys.argv[1])
    else:
        initiator(sys.argv[1])
