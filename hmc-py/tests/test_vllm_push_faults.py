"""A decode loop in the shape of vLLM's NixlConnector push mode, on ``hmc.nixl``, through a
run with faults: notifications dropped and duplicated (``HMC_CONFIG``'s ``faults``, by
chance under a seed, at the prefill's sending side and at the decode's receiving side) and
the prefill process killed and started again once mid-run.

Push mode: notifications are the control channel. The decode asks for a request by a NIXL
notification to the prefill (``REQ rid attempt slot``: where its blocks go); the prefill
WRITEs the request's KV blocks into the decode's registered cache with a notification
(``DONE rid attempt slot``) that tells the decode they are there. Each block's bytes are a
function of the request id and the block's index, so the decode checks every block it
accepts. The decode keeps going: a request whose notification does not come within
REQUEST_TIMEOUT_S is asked for again (a new attempt, in a new slot); a notification of an
attempt given up on is not accepted; a notification arriving twice would not be counted
twice, and with hmc none arrives twice at all (asserted). When the prefill dies, the
decode's next notification to it fails, and the decode loads the new prefill's metadata
(vLLM's handshake again, here handed over by the test, which plays vLLM's proxy).

The prefill is this file run as a script (``python test_vllm_push_faults.py prefill TRANSPORT``).
vLLM itself is not needed.
"""

import collections
import os
import subprocess
import sys
import time

import numpy as np
import pytest

# Requests, and the decode's cache: SLOTS slots of BLOCKS blocks of BLOCK bytes.
REQUESTS = 40
BLOCKS, BLOCK = 4, 16 << 10
SLOTS = 24
# The prefill's staging: as many requests' blocks as it may have in flight.
STAGING = 16
# How many requests the decode keeps asked for at once.
WINDOW = 4
# A request whose notification has not come by then is asked for again; its slot is not
# reused for QUARANTINE_S more (a write of that attempt still in flight could land there).
REQUEST_TIMEOUT_S = 3.0
QUARANTINE_S = 5.0
# The whole run's bound (about 15 s here on 2 cores; the rest is slack for a loaded machine).
RUN_BOUND_S = 120
# The prefill is killed once this many requests were accepted.
KILL_AT = REQUESTS // 2
NO_PROGRESS_MS = 1000
# Sending side (the prefill's WRITEs' notifications), receiving side (the decode's).
PREFILL_FAULTS = "seed=3;notify.drop=0.12;notify.dup=0.12"
DECODE_FAULTS = "seed=4;notify.at=receiver;notify.dup=0.15;notify.drop=0.05"


def nixl_errors():
    """NIXL's exception classes (each its own class, as NIXL's bindings define them)."""
    from hmc.nixl import _bindings

    return tuple(v for k, v in vars(_bindings).items()
                 if k.startswith("nixl") and k.endswith("Error") and isinstance(v, type))


def block_bytes(rid: int, b: int) -> np.ndarray:
    """Block ``b`` of request ``rid``: what the prefill computes, and the decode checks."""
    return ((np.arange(BLOCK, dtype=np.uint32) * (2 * rid + 1) + 131 * b + 7 * rid) % 251).astype(np.uint8)


def block_rows(base: int, count: int):
    return np.array([(base + i * BLOCK, BLOCK, 0) for i in range(count)], dtype=np.int64)


# ---------------------------------------------------------------------------- the prefill


def prefill_main(transport):
    """The prefill: prints ``MD <hex>``, reads the decode's ``MD <hex> <cache address>`` on
    stdin, then serves ``REQ`` notifications (WRITEs with a ``DONE`` notification, several
    in flight) until a ``STOP`` notification."""
    from hmc.nixl._api import nixl_agent, nixl_agent_config
    nixlError = nixl_errors()
    agent = nixl_agent("prefill", nixl_agent_config(backends=[transport]))
    staging = np.zeros(STAGING * BLOCKS * BLOCK, np.uint8)
    agent.register_memory([(staging.ctypes.data, staging.nbytes, 0, "")], "DRAM")
    print("MD", agent.get_agent_metadata().hex(), flush=True)
    words = sys.stdin.readline().split()
    name = agent.add_remote_agent(bytes.fromhex(words[1]))
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_rows(staging.ctypes.data, STAGING * BLOCKS), "DRAM")
    remote = agent.prep_xfer_dlist(name, block_rows(int(words[2]), SLOTS * BLOCKS), "DRAM")
    free, inflight, waiting = list(range(STAGING)), {}, collections.deque()
    while True:
        for msg in agent.get_new_notifs().get("decode", []):
            if msg == b"STOP":
                return
            waiting.append(msg.decode())
        while waiting and free:
            _, rid, attempt, slot = waiting.popleft().split()
            s = free.pop()
            for b in range(BLOCKS):  # the "forward": the request's KV, into staging
                staging[(s * BLOCKS + b) * BLOCK:(s * BLOCKS + b + 1) * BLOCK] = block_bytes(int(rid), b)
            h = agent.make_prepped_xfer(
                "WRITE", local, [s * BLOCKS + b for b in range(BLOCKS)],
                remote, [int(slot) * BLOCKS + b for b in range(BLOCKS)], f"DONE {rid} {attempt} {slot}".encode())
            agent.transfer(h)
            inflight[s] = h
        for s, h in list(inflight.items()):
            try:
                st = agent.check_xfer_state(h)
            except nixlError:
                st = "ERR"
            if st != "PROC":  # DONE, or ERR (a dropped notification): the decode asks again
                agent.release_xfer_handle(h)
                del inflight[s]
                free.append(s)
        time.sleep(0.0005)


class Prefill:
    def __init__(self, transport, config, decode_md: bytes, cache: int):
        self.p = subprocess.Popen([sys.executable, __file__, "prefill", transport], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, HMC_CONFIG=config))
        # (after NIXL's log lines; the loop ends should the prefill die first)
        line = next((ln for ln in self.p.stdout if ln.startswith("MD ")), None)
        assert line, f"the prefill ended before its metadata (exit {self.p.wait(10)})"
        self.md = bytes.fromhex(line.split()[1])
        self.p.stdin.write(f"MD {decode_md.hex()} {cache}\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(30)


# ---------------------------------------------------------------------------- the decode


# tcp, and shm: what NIXL's "UCX" backend gets on one host (hmc's `auto`).
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_push_mode_decode_loop_keeps_going_through_lost_and_doubled_notifications_and_a_restarted_prefill(transport, tmp_path, monkeypatch):
    from hmc.nixl._api import nixl_agent, nixl_agent_config
    nixlError = nixl_errors()

    def config(name, faults):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'no_progress_timeout_ms = {NO_PROGRESS_MS}\n[nixl]\nfaults = "{faults}"\n')
        return str(path)

    prefill_cfg = config("prefill", PREFILL_FAULTS)
    monkeypatch.setenv("HMC_CONFIG", config("decode", DECODE_FAULTS))
    decode = nixl_agent("decode", nixl_agent_config(backends=[transport]))
    cache = np.zeros(SLOTS * BLOCKS * BLOCK, np.uint8)
    decode.register_memory([(cache.ctypes.data, cache.nbytes, 0, "")], "DRAM")
    md = decode.get_agent_metadata()
    prefills = [Prefill(transport, prefill_cfg, md, cache.ctypes.data)]
    try:
        decode.add_remote_agent(prefills[0].md)
        pending = collections.deque(range(REQUESTS))  # not yet asked for (or given up on)
        asked = {}  # rid -> (attempt, slot, when asked)
        attempts = collections.Counter()
        free_at = {s: 0.0 for s in range(SLOTS)}  # slot -> when it may be used again
        seen = collections.Counter()  # (rid, attempt) -> notifications of it
        accepted, stale, retried, handshakes = {}, 0, 0, 0
        start = time.monotonic()

        def free_slot(now):
            return next((s for s, t in free_at.items() if t <= now and all(a[1] != s for a in asked.values())), None)

        def ask(rid, now):
            nonlocal handshakes
            slot = free_slot(now)
            if slot is None:
                pending.appendleft(rid)
                return False
            attempts[rid] += 1
            free_at[slot] = float("inf")
            cache[slot * BLOCKS * BLOCK:(slot + 1) * BLOCKS * BLOCK] = 0
            asked[rid] = (attempts[rid], slot, now)
            try:
                decode.send_notif("prefill", f"REQ {rid} {attempts[rid]} {slot}".encode())
            except nixlError:
                # The prefill is gone: vLLM's handshake again, with the new one's metadata
                # (from the proxy: here, the test). The request is asked for again below.
                decode.remove_remote_agent("prefill")
                decode.add_remote_agent(prefills[-1].md)
                handshakes += 1
                asked[rid] = (attempts[rid], slot, now - REQUEST_TIMEOUT_S)
            return True

        while len(accepted) < REQUESTS:
            now = time.monotonic()
            assert now - start < RUN_BOUND_S, (
                f"{len(accepted)} of {REQUESTS} requests in {RUN_BOUND_S} s "
                f"(retried {retried}, stale {stale}, handshakes {handshakes})")
            while pending and len(asked) < WINDOW and ask(pending.popleft(), now):
                pass
            for agent, msgs in decode.get_new_notifs().items():
                assert agent == "prefill", agent
                for m in msgs:
                    _, rid, attempt, slot = m.decode().split()
                    rid, attempt, slot = int(rid), int(attempt), int(slot)
                    seen[(rid, attempt)] += 1
                    if rid in accepted or asked.get(rid, (None,))[0] != attempt:
                        stale += 1  # a doubled one, or of an attempt given up on: not counted
                        continue
                    assert slot == asked[rid][1]
                    got = cache[slot * BLOCKS * BLOCK:(slot + 1) * BLOCKS * BLOCK]
                    for b in range(BLOCKS):
                        assert (got[b * BLOCK:(b + 1) * BLOCK] == block_bytes(rid, b)).all(), (
                            f"request {rid} (attempt {attempt}): block {b} is not what the prefill wrote")
                    accepted[rid] = attempt
                    del asked[rid]
                    free_at[slot] = 0.0
            for rid, (attempt, slot, when) in list(asked.items()):
                if now - when > REQUEST_TIMEOUT_S:  # its notification never came: ask again
                    del asked[rid]
                    free_at[slot] = now + QUARANTINE_S
                    retried += 1
                    pending.appendleft(rid)
            if len(accepted) >= KILL_AT and len(prefills) == 1:
                # The prefill dies mid-run (requests in flight) and a new one starts under its
                # name; the decode finds out when it next notifies it.
                prefills[0].p.kill()
                prefills[0].p.wait(30)
                prefills.append(Prefill(transport, prefill_cfg, md, cache.ctypes.data))
            time.sleep(0.001)
        took = time.monotonic() - start
        doubled = {k: n for k, n in seen.items() if n > 1}
        print(f"{REQUESTS} requests in {took:.1f} s: {sum(attempts.values())} asked, {retried} "
              f"timed out and asked again, {stale} stale notifications, {handshakes} handshakes again")
        assert not doubled, f"notifications delivered more than once: {doubled}"
        assert retried > 0, "no notification was lost: the faults did not act"
        assert handshakes == 1, "the restarted prefill was loaded once"
        assert sorted(accepted) == list(range(REQUESTS))
        try:
            decode.send_notif("prefill", b"STOP")
        except nixlError:
            pass
    finally:
        for p in prefills:
            p.close()
        decode._engine.finalize()


if __name__ == "__main__":
    prefill_main(sys.argv[2])
