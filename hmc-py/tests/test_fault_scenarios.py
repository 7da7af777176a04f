"""Fault scenarios through NIXL's and Mooncake's APIs (``hmc.nixl``, ``hmc.mooncake``) over
tcp, shm and ucx, each ending as the behaviour tables of
docs/guide/port-from-nixl-mooncake.md say:

- stall: the peer process SIGSTOPped under a READ and under a WRITE: the transfer ends
  ``"ERR"`` within the no-progress timeout plus slack (through hmc.mooncake a negative code
  at its call timeout, which the tests shorten: its one-shot transfers are not bounded by
  the no-progress timeout); after SIGCONT no byte of the abandoned WRITE lands at the peer
  and no byte of the abandoned READ lands here; the same request posted again completes
  (over ucx later, at the transport's drain and abandon timeouts: see UCX_DRAIN_S);
- late bytes: a transfer released (``release_xfer_handle``) in flight: once the release
  returns, canaries on both sides stay;
- restart: the peer killed and started again under its name: the old request's next post
  is NIXL's remote disconnect or ``"ERR"`` (a negative code), no byte of the new process is
  reached through it, and loading the new metadata recovers;
- injected faults (``HMC_CONFIG``'s ``faults``: xfer.stall, xfer.cut, disconnect.after,
  notify.drop, notify.dup): each ends as docs/faults.md says, and the next operation
  succeeds (after remove + add of the remote agent where the peer was lost).

The peer is this file run as a script (``python test_fault_scenarios.py API TRANSPORT``),
talked to over its stdin and stdout. The engines run with a 1 s no-progress timeout (the
``HMC_CONFIG`` key ``no_progress_timeout_ms``), so that a stall ends fast; every bound
below leaves seconds of slack for a loaded machine.
"""

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
# The peer's two regions (a source it fills with PEER_SEED's pattern, a destination holding
# PEER_CANARY) and this process's two (LOCAL_SEED's pattern, LOCAL_CANARY).
N = 1 << 20
PEER_SEED, LOCAL_SEED = 11, 22
PEER_CANARY, LOCAL_CANARY = 0x5A, 0xA5
# The engines' no-progress timeout, and the slack a stalled transfer's end is allowed past it.
NO_PROGRESS_MS = 1000
SLACK_S = 10
# How long after an abandoned transfer a late byte would have landed, were it to.
LATE_WAIT_S = 0.5


def _ucx_missing():
    try:
        ctypes.CDLL(os.environ.get("HMC_UCX_LIB", "libucp.so.0"))
        return None
    except OSError as e:
        return f"libucp cannot be loaded here ({e}): the ucx transport needs UCX (apt-get install libucx0)"


UCX_MISSING = _ucx_missing()
TRANSPORTS = ["tcp", "shm", pytest.param("ucx", marks=pytest.mark.skipif(bool(UCX_MISSING), reason=UCX_MISSING or ""))]


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def digest(a) -> str:
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()[:16]


def write_config(path, transport, faults="", module="nixl"):
    """An HMC_CONFIG file: the short no-progress timeout, the transport (for hmc.mooncake,
    whose protocol names only tcp and rdma) and the fault spec."""
    lines = [f"no_progress_timeout_ms = {NO_PROGRESS_MS}", f"ucx_drain_timeout_ms = {UCX_DRAIN_MS}",
             f"[{module}]"]
    if module == "mooncake":
        lines.append(f'transport = "{transport}"')
    if faults:
        lines.append(f'faults = "{faults}"')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ---------------------------------------------------------------------------- the peer


def peer_main(api, transport):
    """The peer: registers a source of PEER_SEED's pattern and a destination of
    PEER_CANARY, prints ``READY {json}``, then answers lines: ``dst`` (the destination's
    digest), ``canary`` (refills it), ``notifs`` (the notifications so far, after waiting
    up to 3 s for one), ``quit``."""
    src = pattern(N, PEER_SEED)
    dst = np.full(N, PEER_CANARY, np.uint8)
    if api == "nixl":
        from hmc.nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent("target", nixl_agent_config(backends=[transport]))
        agent.register_memory([(src.ctypes.data, N, 0, ""), (dst.ctypes.data, N, 0, "")], "DRAM")
        ready = {"md": agent.get_agent_metadata().hex()}

        def notifs():
            got = agent.get_new_notifs()
            return {k: [m.decode() for m in v] for k, v in got.items()}
    else:
        from hmc.mooncake import TransferEngine

        agent = TransferEngine()
        assert agent.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert agent.register_memory(src.ctypes.data, N) == 0
        assert agent.register_memory(dst.ctypes.data, N) == 0
        ready = {"session": f"127.0.0.1:{agent.get_rpc_port()}"}

        def notifs():
            out = {}
            for n in agent.get_notifies():
                out.setdefault(n.name, []).append(n.msg)
            return out
    ready.update(src=src.ctypes.data, dst=dst.ctypes.data, pid=os.getpid())
    print("READY", json.dumps(ready), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "dst":
            print("DST", digest(dst), flush=True)
        elif cmd == "canary":
            dst[:] = PEER_CANARY
            print("OK", flush=True)
        elif cmd.startswith("notifs"):
            # "notifs S": S seconds for the first one (3 unless given).
            end, got = time.monotonic() + float(cmd.split()[1] if " " in cmd else 3), {}
            while time.monotonic() < end:
                for k, v in notifs().items():
                    got.setdefault(k, []).extend(v)
                if got:
                    time.sleep(0.3)  # a second copy, were one coming, has time to arrive
                    for k, v in notifs().items():
                        got.setdefault(k, []).extend(v)
                    break
                time.sleep(0.01)
            print("NOTIFS", json.dumps(got), flush=True)
        else:
            break


class PeerProc:
    """This file run as the peer, in its own process."""

    def __init__(self, api, transport, config):
        self.config = config
        env = dict(os.environ, HMC_CONFIG=config)
        self.p = subprocess.Popen([sys.executable, __file__, api, transport], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        self.info = json.loads(self.ask(None, "READY"))

    def ask(self, line, word):
        if line is not None:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        for out in self.p.stdout:
            w = out.split(maxsplit=1)
            if w and w[0] == word:
                return w[1].strip() if len(w) > 1 else ""
        raise AssertionError(f"the peer ended before answering {line!r} (exit {self.p.wait(10)})")

    def dst(self):
        return self.ask("dst", "DST")

    def notifs(self, wait=3.0):
        """The notifications the peer got (waiting up to ``wait`` seconds for the first)."""
        return json.loads(self.ask(f"notifs {wait}", "NOTIFS"))

    def stop(self):
        stop_process(self.p.pid)

    def cont(self):
        os.kill(self.p.pid, signal.SIGCONT)

    def kill(self):
        self.p.kill()
        self.p.wait(30)

    def close(self):
        if self.p.poll() is None:
            try:
                self.cont()
                self.p.stdin.write("quit\n")
                self.p.stdin.close()
                self.p.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait(10)


@pytest.fixture
def peers():
    """Starts peers (``start(api, transport, config)``) and ends every one at teardown."""
    started = []

    def start(api, transport, config):
        p = PeerProc(api, transport, config)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Writes HMC_CONFIG for this process (``config(transport, faults, module)``) and
    returns its path; UCX is kept to its TCP transport unless UCX_TLS says otherwise (as
    `cargo xtask chaos` runs it)."""
    monkeypatch.setenv("UCX_TLS", os.environ.get("UCX_TLS", "tcp"))
    count = [0]

    def use(transport, faults="", module="nixl", here=True):
        count[0] += 1
        path = write_config(tmp_path / f"hmc-{count[0]}.toml", transport, faults, module)
        if here:
            monkeypatch.setenv("HMC_CONFIG", path)
        return path

    return use


@pytest.fixture
def pairs(config, peers):
    """``make(api, transport, theirs="", mine="")``: a peer process whose HMC_CONFIG has the
    fault spec ``theirs`` and this process's side (:class:`Local` for ``"nixl"``,
    :class:`Engine` for ``"mooncake"``) under ``mine``; both ended at teardown."""
    made = []

    def make(api, transport, theirs="", mine=""):
        peer = peers(api, transport, config(transport, theirs, module=api, here=False))
        config(transport, "seed=5;" + mine if mine else "", module=api)
        local = Local(transport, peer) if api == "nixl" else Engine(peer)
        made.append((peer, local))
        return peer, local

    yield make
    for peer, local in made:
        if peer.p.poll() is None:
            peer.cont()
        local.close()


# ---------------------------------------------------------------------------- hmc.nixl


class Local:
    """This process's side through hmc.nixl: an agent with a source of LOCAL_SEED's pattern
    and a destination of LOCAL_CANARY, and a READ and a WRITE of the peer's regions."""

    def __init__(self, transport, peer, name="initiator"):
        from hmc.nixl._api import nixl_agent, nixl_agent_config

        self.a = nixl_agent(name, nixl_agent_config(backends=[transport]))
        self.src = pattern(N, LOCAL_SEED)
        self.dst = np.full(N, LOCAL_CANARY, np.uint8)
        self.a.register_memory([(self.src.ctypes.data, N, 0, ""), (self.dst.ctypes.data, N, 0, "")], "DRAM")
        self.load(peer)

    def load(self, peer):
        self.peer = peer
        self.name = self.a.add_remote_agent(bytes.fromhex(peer.info["md"]))

    def xfer(self, op, notif=b""):
        """READ: the peer's source into our destination; WRITE: our source into its
        destination."""
        local, remote = (self.dst, self.peer.info["src"]) if op == "READ" else (self.src, self.peer.info["dst"])
        return self.a.initialize_xfer(op, self.a.get_xfer_descs([(local.ctypes.data, N, 0)], "DRAM"),
                                      self.a.get_xfer_descs([(remote, N, 0)], "DRAM"), self.name, notif)

    def post(self, h, limit=NO_PROGRESS_MS / 1000 + SLACK_S):
        """Posts ``h`` and waits for its end: its state (``"DISCONNECT"`` for NIXL's remote
        disconnect error) and how long it took."""
        from hmc.nixl._bindings import nixlRemoteDisconnectError

        t0 = time.monotonic()
        try:
            st = self.a.transfer(h)
            while st == "PROC" and time.monotonic() - t0 < limit + 5:
                time.sleep(0.002)
                st = self.a.check_xfer_state(h)
        except nixlRemoteDisconnectError:
            st = "DISCONNECT"
        return st, time.monotonic() - t0

    def reload(self, peer):
        """remove_remote_agent, then add_remote_agent of ``peer``'s metadata."""
        self.a.remove_remote_agent(self.name)
        self.load(peer)

    def close(self):
        self.a._engine.finalize()


def check_read(local, ok=True):
    want = digest(pattern(N, PEER_SEED)) if ok else digest(np.full(N, LOCAL_CANARY, np.uint8))
    assert digest(local.dst) == want, "the READ's destination here is not as it should be"


def check_write(peer, ok=True):
    want = digest(pattern(N, LOCAL_SEED)) if ok else digest(np.full(N, PEER_CANARY, np.uint8))
    assert peer.dst() == want, "the WRITE's destination at the peer is not as it should be"


# Over ucx a transfer abandoned at a stopped peer (its no-progress timeout, or a release in
# flight) ends once its flush has not completed within the transport's drain_timeout (the
# engine option ucx_drain_timeout_ms: 10 s by default, UCX_DRAIN_MS here, which every
# HMC_CONFIG of this file sets) and the peer was told to drop that UCX endpoint generation:
# a stopped peer cannot answer, so that costs ucx_abandon_timeout_ms (1 s) too. The peer
# drops what it holds of the generation before it runs UCX's progress again, and the next
# post works on a new one.
UCX_DRAIN_MS = 2000
UCX_ABANDON_S = 1
UCX_DRAIN_S = UCX_DRAIN_MS / 1000 + UCX_ABANDON_S


def bound(transport):
    """How long a transfer stalled at a stopped peer may take to end."""
    return NO_PROGRESS_MS / 1000 + SLACK_S + (UCX_DRAIN_S if transport == "ucx" else 0)


STALL_TRANSPORTS = TRANSPORTS


def works_again(local, h, transport):
    """Posts ``h`` again: it moves every byte."""
    st, _ = local.post(h)
    assert st == "DONE", f"posted again over {transport}: {st}"


def new_requests_move_every_byte(local, peer):
    for op in ("READ", "WRITE"):
        h = local.xfer(op)
        assert local.post(h)[0] == "DONE", f"a new {op}"
        local.a.release_xfer_handle(h)
    check_read(local)
    check_write(peer)


def warm(local, peer, transport):
    """A READ and a WRITE moved before the stop (not over shm, where a request the peer
    has granted a lease for needs nothing more of it), then the canaries back."""
    hs = {op: local.xfer(op) for op in ("READ", "WRITE")}
    if transport != "shm":
        for h in hs.values():
            assert local.post(h)[0] == "DONE"
        local.dst[:] = LOCAL_CANARY
        assert peer.ask("canary", "OK") == ""
    return hs


def wait_all(local, hs, t0):
    """Waits for each of the posted requests ``hs`` to end: {op: (state, seconds)}."""
    from hmc.nixl._bindings import nixlRemoteDisconnectError

    out = {}
    while len(out) < len(hs):
        for op, h in hs.items():
            if op in out:
                continue
            try:
                st = local.a.check_xfer_state(h)
            except nixlRemoteDisconnectError:
                st = "DISCONNECT"
            if st != "PROC":
                out[op] = (st, time.monotonic() - t0)
        assert time.monotonic() - t0 < 60, f"still in flight after 60 s: {out}"
        time.sleep(0.002)
    return out


@pytest.mark.parametrize("transport", STALL_TRANSPORTS)
def test_nixl_stall_ends_err_without_late_bytes_and_the_request_works_again(transport, pairs):
    """A READ and a WRITE posted to the stopped peer (every thread of it stopped first:
    conftest.stop_process) both end "ERR" within the no-progress timeout plus slack (over
    ucx plus its drain and abandon timeouts); after SIGCONT neither lands a byte; posted
    again, each moves every byte."""
    peer, local = pairs("nixl", transport)
    hs = warm(local, peer, transport)
    peer.stop()
    t0 = time.monotonic()
    for h in hs.values():
        assert local.a.transfer(h) == "PROC"
    for op, (st, took) in wait_all(local, hs, t0).items():
        assert st == "ERR", f"{op} to a stopped peer over {transport}: {st}"
        assert took < bound(transport), f"{op} ended after {took:.1f} s"
    peer.cont()
    time.sleep(LATE_WAIT_S)
    check_read(local, ok=False)
    check_write(peer, ok=False)
    # The same requests, posted again to the running peer, move every byte.
    for h in hs.values():
        works_again(local, h, transport)
    check_read(local)
    check_write(peer)
    if transport == "shm":
        # Over shm a request whose lease the peer granted needs nothing more of it: at
        # the stopped peer it completes (the kernel copies; the peer need not run).
        local.dst[:] = LOCAL_CANARY
        peer.stop()
        for h in hs.values():
            assert local.post(h)[0] == "DONE"
        check_read(local)
        peer.cont()
    for h in hs.values():
        local.a.release_xfer_handle(h)


@pytest.mark.parametrize("transport", STALL_TRANSPORTS)
def test_nixl_release_in_flight_leaves_no_late_bytes(transport, pairs):
    """Requests released while in flight: a READ and a WRITE at the stopped peer (in flight
    for certain), then at the running peer right after each of many posts. Once the
    release returns, a canary on either side stays."""
    peer, local = pairs("nixl", transport)
    hs = warm(local, peer, transport)
    peer.stop()
    for h in hs.values():
        assert local.a.transfer(h) == "PROC"
    t0 = time.monotonic()
    for h in hs.values():
        local.a.release_xfer_handle(h)
    assert time.monotonic() - t0 < bound(transport)
    peer.cont()
    time.sleep(LATE_WAIT_S)
    check_read(local, ok=False)
    check_write(peer, ok=False)
    if transport == "ucx":
        h = local.xfer("READ")
        works_again(local, h, transport)
        local.a.release_xfer_handle(h)
        local.dst[:] = LOCAL_CANARY
    # At a running peer: posts released at once, canaries written after each release.
    for op in ("READ", "WRITE"):
        for _ in range(5):
            h = local.xfer(op)
            local.a.transfer(h)
            local.a.release_xfer_handle(h)
            local.dst[:] = LOCAL_CANARY
            assert peer.ask("canary", "OK") == ""
        time.sleep(LATE_WAIT_S)
        check_read(local, ok=False)
        check_write(peer, ok=False)
    # The agent works on: a new request moves every byte.
    new_requests_move_every_byte(local, peer)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nixl_restarted_peer_is_a_disconnect_and_new_metadata_recovers(transport, pairs, peers):
    peer, local = pairs("nixl", transport)
    hs = {op: local.xfer(op) for op in ("READ", "WRITE")}
    for h in hs.values():
        assert local.post(h)[0] == "DONE"
    local.dst[:] = LOCAL_CANARY
    peer.kill()
    new = peers("nixl", transport, peer.config)  # the same agent name, "target"
    for op, h in hs.items():
        st, took = local.post(h)
        # NIXL's remote disconnect error, or "ERR" (the guide's NIXL table).
        assert st in ("DISCONNECT", "ERR"), f"{op} through the old request: {st}"
        assert took < NO_PROGRESS_MS / 1000 + SLACK_S
        local.a.release_xfer_handle(h)
    time.sleep(LATE_WAIT_S)
    check_read(local, ok=False)
    check_write(new, ok=False)
    local.reload(new)
    new_requests_move_every_byte(local, new)


# The injected faults: spec at the initiator, spec at the target, how many posts succeed
# before the fault acts, what the post it acts on ends as, whether the peer is lost to it
# (then loaded again), what of that post lands. The notification faults act in the
# engine's notification path (its metadata service's connection, not the data transport:
# docs/faults.md), so they run over tcp only; the transfer faults over every transport.
INJECTED = {
    "xfer.stall": ("xfer.stall=30s@first:1", "", 0, "ERR", False, "none"),
    "xfer.cut": ("xfer.cut=0.5@first:1", "", 0, "ERR", False, "half"),
    "disconnect.after": ("disconnect.after=1", "", 1, "ERR|DISCONNECT", True, "none"),
    "notify.drop": ("notify.drop=first:1", "", 0, "ERR", False, "all"),
    "notify.drop.receiver": ("", "notify.at=receiver;notify.drop=first:1", 0, "ERR", False, "all"),
    "notify.dup": ("notify.dup=first:1", "", 0, "DONE", False, "all"),
    "notify.dup.receiver": ("", "notify.at=receiver;notify.dup=first:1", 0, "DONE", False, "all"),
}
NOTIFY_FAULTS_OVER = "tcp"


def injected_cases(table):
    return [pytest.param(t, f, id=f"{t}-{f}") for f in table for t in ("tcp", "shm", "ucx")
            if t == NOTIFY_FAULTS_OVER or not f.startswith("notify")]


def ucx_skip(transport):
    if transport == "ucx" and UCX_MISSING:
        pytest.skip(UCX_MISSING)


def landed(local, lands):
    """The digest of the peer's destination after a WRITE of which ``lands`` landed."""
    canary = np.full(N, PEER_CANARY, np.uint8)
    return digest({"none": canary, "all": local.src,
                   "half": np.concatenate([local.src[: N // 2], canary[N // 2:]])}[lands])


@pytest.mark.parametrize("transport, fault", injected_cases(INJECTED))
def test_nixl_injected_fault_ends_as_documented_and_the_next_post_succeeds(transport, fault, pairs):
    """The fault acts on a WRITE with a notification: it ends as docs/faults.md says, within
    the no-progress timeout plus slack; the target never sees a notification twice, nor
    one of a failed post; no byte lands after the end; the next WRITE is DONE and its
    notification seen once."""
    ucx_skip(transport)
    mine, theirs, before, want, lost, lands = INJECTED[fault]
    peer, local = pairs("nixl", transport, theirs, mine)
    h = local.xfer("WRITE", b"first")
    for _ in range(before):
        assert local.post(h)[0] == "DONE"
        assert peer.notifs() == {"initiator": ["first"]}
        assert peer.ask("canary", "OK") == ""
    st, took = local.post(h)
    assert st in want.split("|"), f"{fault} over {transport}: {st}"
    assert took < NO_PROGRESS_MS / 1000 + SLACK_S, f"{fault}: ended after {took:.1f} s"
    # (The peer's wait for notifications is also the wait for late bytes.)
    if st == "DONE":
        assert peer.notifs() == {"initiator": ["first"]}, f"{fault}: not seen exactly once"
    else:
        # A failed post's notification never reaches get_new_notifs (its failure notice
        # is logged at the target instead).
        seen = peer.notifs(LATE_WAIT_S)
        assert seen == {}, f"{fault}: a failed post's notification was seen: {seen}"
    assert peer.dst() == landed(local, lands), f"{fault}: the destination is not what {lands!r} says"
    local.a.release_xfer_handle(h)
    if lost:
        local.reload(peer)
    assert peer.ask("canary", "OK") == ""
    h = local.xfer("WRITE", b"second")
    st, _ = local.post(h)
    assert st == "DONE", f"after {fault} over {transport}: {st}"
    assert peer.notifs() == {"initiator": ["second"]}
    check_write(peer)
    local.a.release_xfer_handle(h)


# ---------------------------------------------------------------------------- hmc.mooncake

# hmc.mooncake's transfer_sync_* are the engine's one-shot transfers, bounded by the call's
# timeout (hmc.mooncake's _TIMEOUT_MS, 30 s), not by no_progress_timeout_ms (which bounds
# prepared posts: hmc.nixl's). The tests shorten it to this.
MOONCAKE_TIMEOUT_MS = 1000


class Engine:
    """This process's side through hmc.mooncake."""

    def __init__(self, peer):
        from hmc.mooncake import TransferEngine

        self.te = TransferEngine()
        assert self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self.src = pattern(N, LOCAL_SEED)
        self.dst = np.full(N, LOCAL_CANARY, np.uint8)
        assert self.te.register_memory(self.src.ctypes.data, N) == 0
        assert self.te.register_memory(self.dst.ctypes.data, N) == 0
        self.peer = peer

    def sync(self, op, notify=None):
        """A synchronous READ or WRITE (with a TransferNotify): its code and how long it took."""
        from hmc.mooncake import TransferEngine, TransferNotify

        t0 = time.monotonic()
        session = self.peer.info["session"]
        local, remote = (self.dst, self.peer.info["src"]) if op == "READ" else (self.src, self.peer.info["dst"])
        opcode = TransferEngine.TransferOpcode.Read if op == "READ" else TransferEngine.TransferOpcode.Write
        note = TransferNotify("initiator", notify) if notify else None
        code = self.te.transfer_sync(session, local.ctypes.data, remote, N, opcode, note)
        return code, time.monotonic() - t0

    def close(self):
        self.te._e.finalize()


@pytest.fixture
def short_calls(monkeypatch):
    import hmc.mooncake

    monkeypatch.setattr(hmc.mooncake, "_TIMEOUT_MS", MOONCAKE_TIMEOUT_MS)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mooncake_stall_fails_without_late_bytes_and_the_call_works_again(transport, pairs, short_calls):
    peer, local = pairs("mooncake", transport)
    # Connected (hmc.mooncake connects on first use; send_probe does it) but no transfer
    # yet: over shm the first one needs the peer's lease, later ones would not.
    assert local.te.send_probe(peer.info["session"]) == 0
    for op in ("READ", "WRITE"):
        peer.stop()
        code, took = local.sync(op)
        assert code < 0, f"{op} to a stopped peer over {transport}: {code}"
        assert took < MOONCAKE_TIMEOUT_MS / 1000 + SLACK_S + (UCX_DRAIN_S if transport == "ucx" else 0), \
            f"{op} ended after {took:.1f} s"
        peer.cont()
        time.sleep(LATE_WAIT_S)
        check_read(local, ok=False) if op == "READ" else check_write(peer, ok=False)
        assert local.sync(op)[0] == 0
        check_read(local) if op == "READ" else check_write(peer)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mooncake_restarted_peer_fails_the_old_session_and_the_new_one_works(transport, pairs, peers, short_calls):
    """Under P2PHANDSHAKE a restarted engine has a new session name (``ip:port``, the port
    free when it starts): the old name's next transfer fails with a negative code, reaching
    nothing of the new process; the new name works."""
    peer, local = pairs("mooncake", transport)
    for op in ("READ", "WRITE"):
        assert local.sync(op)[0] == 0
    local.dst[:] = LOCAL_CANARY
    peer.kill()
    new = peers("mooncake", transport, peer.config)
    for op in ("READ", "WRITE"):
        code, took = local.sync(op)
        assert code < 0, f"{op} through the old session over {transport}: {code}"
        assert took < MOONCAKE_TIMEOUT_MS / 1000 + SLACK_S
    time.sleep(LATE_WAIT_S)
    check_read(local, ok=False)
    check_write(new, ok=False)
    local.peer = new
    for op in ("READ", "WRITE"):
        assert local.sync(op)[0] == 0
    check_read(local)
    check_write(new)


# As INJECTED, through hmc.mooncake (which sends a TransferNotify after the bytes, as a
# standalone notification: a dropped one fails the call at its timeout, as notify.drop says).
MOONCAKE_INJECTED = {
    "xfer.stall": ("xfer.stall=30s@first:1", "", 0, "none"),
    "xfer.cut": ("xfer.cut=0.5@first:1", "", 0, "half"),
    "disconnect.after": ("disconnect.after=1", "", 1, "none"),
    "notify.drop": ("notify.drop=first:1", "", 0, "all"),
    "notify.dup": ("notify.dup=first:1", "", 0, "all"),
    "notify.dup.receiver": ("", "notify.at=receiver;notify.dup=first:1", 0, "all"),
}


@pytest.mark.parametrize("transport, fault", injected_cases(MOONCAKE_INJECTED))
def test_mooncake_injected_fault_ends_as_documented_and_the_next_call_succeeds(transport, fault, pairs, short_calls):
    """A failed call returns a negative code with no byte landing after it; the next call
    succeeds (after a lost connection, hmc.mooncake connects again by itself, as Mooncake's
    next transfer does); a notification is seen once, and never one of a failed call."""
    ucx_skip(transport)
    mine, theirs, before, lands = MOONCAKE_INJECTED[fault]
    peer, local = pairs("mooncake", transport, theirs, mine)
    for _ in range(before):
        assert local.sync("WRITE", "first")[0] == 0
        assert peer.notifs() == {"initiator": ["first"]}
        assert peer.ask("canary", "OK") == ""
    code, took = local.sync("WRITE", "first")
    ok = fault.startswith("notify.dup")
    assert (code == 0) == ok, f"{fault} over {transport}: {code}"
    assert took < MOONCAKE_TIMEOUT_MS / 1000 + SLACK_S, f"{fault}: ended after {took:.1f} s"
    # (The peer's wait for notifications is also the wait for late bytes.)
    seen = peer.notifs() if ok else peer.notifs(LATE_WAIT_S)
    assert peer.dst() == landed(local, lands), f"{fault}: the destination is not what {lands!r} says"
    assert seen == ({"initiator": ["first"]} if ok else {}), f"{fault}: seen {seen}"
    assert peer.ask("canary", "OK") == ""
    code, _ = local.sync("WRITE", "second")
    assert code == 0, f"after {fault} over {transport}: {code}"
    assert peer.notifs() == {"initiator": ["second"]}
    check_write(peer)


if __name__ == "__main__":
    peer_main(sys.argv[1], sys.argv[2])
