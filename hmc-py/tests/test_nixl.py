"""``hmc.nixl``: NIXL's Python API on hmc. vLLM's sequence of NIXL calls between two
processes (``nixl_vllm_pattern.py``) with checksums, the same script's results beside
NIXL 1.5.1's when an interpreter with it is given (``HMC_NIXL_PYTHON``, set by
``cargo xtask test --long``), and the calls hmc.nixl refuses by name."""

import json
import os
import signal
import time
import subprocess
import sys

import numpy as np
import pytest

from conftest import stop_process
from hmc.nixl import _bindings as nb
from hmc.nixl._api import nixl_agent, nixl_agent_config

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "nixl_vllm_pattern.py")

# What the script prints on NIXL 1.5.1 (and must on hmc.nixl): run against both, the same.
EXPECTED = {
    "remote_name": "prefill",
    "remote_md_ok": True,
    "telemetry": [131072, True, True],
    "estimate": ["int", True, "int", True, "UNKNOWN"],
    "read_states": ["DONE", "DONE", "DONE"],
    "read_bytes_ok": True,
    "prefill_notifs": {"decode": ["req-0", "req-1", "req-2"]},
    "heartbeat": {"decode": ["heartbeat"]},
    "strided_read": ["DONE", True],
    "write": ["DONE", True],
    "remote_xfer_done": True,
    "unknown_agent": "nixlNotFoundError",
    "garbage_md": "nixlMismatchError",
    "exceptions_exist": [True, True, True, True],
    "statuses": [0, 1, -4],
    "after_remove": False,
    "end": "ok",
}


# What nixl_loopback.py prints on NIXL 1.5.1 (and must on hmc.nixl).
LOOPBACK = {
    "own_metadata": True,
    "prepped_read": ["DONE", True, True],
    "notifs": {"self": ["loop"]},
    "write": ["DONE", True],
    "write_notifs": {"self": ["w"]},
    "unregistered": "nixlNotFoundError",
    "send_notif": {"self": ["to myself"]},
    "end": "ok",
}


def run_pattern(python, package, script=SCRIPT):
    out = subprocess.run([python, script, package], capture_output=True, text=True, timeout=120)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            _, key, value = line.split(" ", 2)
            results[key] = json.loads(value)
    assert results.get("end") == "ok", f"{package}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    if package.startswith("hmc."):
        # A clean exit (NIXL 1.5.1's processes crash in their teardown here).
        assert out.returncode == 0, out.stderr[-2000:]
    return results


def test_the_vllm_sequence_runs_on_hmc_nixl():
    assert run_pattern(sys.executable, "hmc.nixl") == EXPECTED


@pytest.mark.skipif(not os.environ.get("HMC_NIXL_PYTHON"), reason="HMC_NIXL_PYTHON (NIXL 1.5.1) not given")
def test_nixl_itself_gives_the_same_results():
    assert run_pattern(os.environ["HMC_NIXL_PYTHON"], "nixl_cu12") == EXPECTED


@pytest.mark.parametrize("package", ["hmc.nixl", pytest.param("nixl_cu12", marks=pytest.mark.skipif(
    not os.environ.get("HMC_NIXL_PYTHON"), reason="HMC_NIXL_PYTHON (NIXL 1.5.1) not given"))])
def test_loopback_lists_move_an_agents_own_memory(package):
    python = sys.executable if package.startswith("hmc.") else os.environ["HMC_NIXL_PYTHON"]
    assert run_pattern(python, package, os.path.join(HERE, "nixl_loopback.py")) == LOOPBACK


# What nixl_partial_md.py prints on NIXL 1.5.1, through etcd and the listen threads.
PARTIAL_MD = {
    "part-1_loaded": True, "part-1_read": ["DONE", True],
    "part-2_loaded": True, "part-2_read": ["DONE", True],
    "invalidated": True, "sent_again": True, "read_again": ["DONE", True], "end": "ok",
}


@pytest.mark.parametrize("via", ["listen", "etcd"])
@pytest.mark.parametrize("package", ["hmc.nixl", pytest.param("nixl_cu12", marks=pytest.mark.skipif(
    not os.environ.get("HMC_NIXL_PYTHON"), reason="HMC_NIXL_PYTHON (NIXL 1.5.1) not given"))])
def test_partial_metadata_invalidation_and_sending_again(package, via, request, monkeypatch):
    """partial_md_example.py's flow: partial metadata in two steps (labelled in etcd, sent
    to the initiator's listen thread otherwise), invalidated, sent again."""
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    if via == "etcd":
        monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://" + request.getfixturevalue("etcd"))
        monkeypatch.setenv("NIXL_ETCD_NAMESPACE", f"partial-{package}")
    python = sys.executable if package.startswith("hmc.") else os.environ["HMC_NIXL_PYTHON"]
    assert run_pattern(python, package, os.path.join(HERE, "nixl_partial_md.py")) == PARTIAL_MD


def test_the_cost_estimate_is_the_agents_own_record_of_that_peer():
    a = nixl_agent("est-a", nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    b = nixl_agent("est-b", nixl_agent_config(backends=["UCX"]))
    src, dst = np.arange(1 << 20, dtype=np.uint8), np.zeros(1 << 20, np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    b.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())

    def xfer(n):
        return a.initialize_xfer("READ", a.get_xfer_descs([(dst.ctypes.data, n, 0)], "DRAM"),
                                 b.get_xfer_descs([(src.ctypes.data, n, 0)], "DRAM"), "est-b")

    big, small = xfer(1 << 20), xfer(4096)
    assert a.estimate_xfer_cost(big) == (0, 0, "UNKNOWN")  # nothing completed with est-b yet
    st = a.transfer(big)
    while st == "PROC":
        st = a.check_xfer_state(big)
    took = a.get_xfer_telemetry(big).xferDuration
    # One post: the estimate of the same request is what it took, with no margin.
    assert a.estimate_xfer_cost(big) == (took, 0, "UNKNOWN")
    # Learnt once per completed post, not per poll.
    assert a.check_xfer_state(big) == "DONE" and len(a._costs["est-b"]) == 1
    assert a.estimate_xfer_cost(small)[0] <= took
    assert (dst == src).all()
    for h in (big, small):
        a.release_xfer_handle(h)
    for x in (a, b):
        x._engine.finalize()


@pytest.mark.parametrize("samples, line", [
    ([(100, 10), (200, 20), (300, 30)], (0.0, 0.1)),          # through the origin
    ([(0, 5), (100, 15), (200, 25)], (5.0, 0.1)),             # a fixed cost per post
    ([(100, 40), (100, 60)], (0.0, 0.5)),                     # one size: through the origin
    ([(100, 50), (200, 10)], (0.0, 0.2)),                     # a falling fit: through the origin
])
def test_the_cost_line(samples, line):
    from hmc.nixl._api import _fit_line

    assert _fit_line(samples) == pytest.approx(line)


@pytest.fixture
def agent():
    a = nixl_agent("solo", nixl_agent_config(backends=["UCX"]))
    yield a
    a._engine.finalize()


@pytest.mark.parametrize("backend", ["POSIX", "GDS", "OBJ"])
def test_storage_backends_are_refused_by_name(agent, backend):
    with pytest.raises(NotImplementedError, match=backend):
        agent.create_backend(backend)


def test_calls_not_carried_raise_not_implemented_naming_them(agent):
    m = np.zeros(4096, np.uint8)
    agent.register_memory([(m.ctypes.data, m.nbytes, 0, "")], "DRAM")
    # VRAM is carried (test_device.py); without a CUDA driver it is refused naming it, as a
    # local backend failure (NIXL's class for it), not as a peer gone.
    with pytest.raises(nb.nixlBackendError, match="libcuda"):
        agent.register_memory([(m.ctypes.data, 16, 0, "")], "VRAM")
    # NIXL's agent core is the record nixl_agent builds; its C++ calls are not carried.
    core = nb.nixlAgent("x", nb.nixlAgentConfig())
    with pytest.raises(NotImplementedError, match="nixlAgent.createBackend"):
        core.createBackend("UCX", {})
    for call, args in [("prep_mem_view", (None,)), ("send_local_metadata", ()),
                       ("fetch_remote_metadata", ("x",)), ("invalidate_local_metadata", ()),
                       ("send_partial_agent_metadata", (None,))]:
        with pytest.raises(NotImplementedError, match=call):
            getattr(agent, call)(*args)


def test_telemetry_needs_capture_and_foreign_metadata_is_refused(agent):
    other = nixl_agent("other", nixl_agent_config(backends=["UCX"]))
    src = np.arange(8192, dtype=np.uint8)
    dst = np.zeros(8192, np.uint8)
    agent.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    other.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    with pytest.raises(nb.nixlNotSupportedError, match="one\\s+transport|agent of its own"):
        agent.create_backend("tcp")  # the agent's transport is auto ("UCX")
    name = agent.add_remote_agent(other.get_agent_metadata())
    local = agent.get_xfer_descs([(dst.ctypes.data, 8192, 0)], "DRAM")
    remote = agent.get_xfer_descs([(src.ctypes.data, 8192, 0)], "DRAM")
    h = agent.initialize_xfer("READ", local, remote, name, b"x")
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    assert st == "DONE" and (dst == src).all()
    with pytest.raises(nb.nixlNoTelemetryError):
        agent.get_xfer_telemetry(h)
    agent.release_xfer_handle(h)
    with pytest.raises(nb.nixlInvalidParamError):
        agent.check_xfer_state(h)  # released
    with pytest.raises(nb.nixlMismatchError, match="hmc agents only"):
        agent.add_remote_agent(b"\x00" * 64)
    other._engine.finalize()


def test_descriptor_lists_pickle_and_keep_their_rows():
    d = nb.nixlXferDList(nb.DRAM_SEG, [(1, 2, 0), (3, 4, 0)])
    a = nixl_agent("lists", nixl_agent_config(backends=[]))
    back = a.deserialize_descs(a.get_serialized_descs(d))
    assert back == d and back.descCount() == 2 and back[1] == (3, 4, 0)
    assert back.getType() == nb.DRAM_SEG and not back.isEmpty()
    with pytest.raises(nb.nixlInvalidParamError):
        nb.nixlRegDList(nb.DRAM_SEG, [(1, 2, 0)])  # a registration row has 4 fields


def test_a_stopped_peer_ends_the_transfer_in_err_and_the_handle_works_again(tmp_path, monkeypatch):
    """NIXL's READ from a peer that stopped answering stays "PROC" over TCP (nixl#2047);
    ours ends "ERR" after the engine's no-progress timeout (here 1 s, from the HMC_CONFIG
    file: what NIXL's API cannot carry), and the same handle, posted again once the peer
    resumes, moves the bytes (an intended difference)."""
    cfg = tmp_path / "hmc.toml"
    cfg.write_text("no_progress_timeout_ms = 5000\n[nixl]\nno_progress_timeout_ms = 1000\n")
    monkeypatch.setenv("HMC_CONFIG", str(cfg))
    env = dict(os.environ, NIXL_PATTERN_BACKEND="tcp")
    p = subprocess.Popen([sys.executable, SCRIPT, "hmc.nixl", "prefill"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        words = next(line for line in p.stdout if line.startswith("MD ")).split()[1:]
        md, addr = bytes.fromhex(words[0]), int(words[1])
        a = nixl_agent("decode", nixl_agent_config(backends=["tcp"]))
        dst = np.zeros(64 * 4096, np.uint8)
        a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
        name = a.add_remote_agent(md)
        lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data, dst.nbytes, 0)], "DRAM")
        rh = a.prep_xfer_dlist(name, [(addr, 64 * 4096, 0)], "DRAM")
        h = a.make_prepped_xfer("READ", lh, [0], rh, [0])
        stop_process(p.pid)  # every thread stopped before the post (else it may answer)
        start = time.monotonic()
        st = a.transfer(h)
        while st == "PROC" and time.monotonic() - start < 30:
            st = a.check_xfer_state(h)
            time.sleep(0.01)
        assert st == "ERR", st
        assert time.monotonic() - start < 4, "the [nixl] table's 1 s timeout applies"
        p.send_signal(signal.SIGCONT)
        st = a.transfer(h)
        while st == "PROC":
            st = a.check_xfer_state(h)
        assert st == "DONE"
        want = np.random.default_rng(100).integers(0, 256, 64 * 4096, dtype=np.uint8)
        assert (dst == want).all()
        a.release_xfer_handle(h)
        a._engine.finalize()
    finally:
        p.send_signal(signal.SIGCONT)
        p.stdin.close()
        p.wait(30)


def test_a_config_file_that_cannot_be_used_is_named(tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    monkeypatch.setenv("HMC_CONFIG", str(bad))
    with pytest.raises(ValueError, match="bad.toml"):
        nixl_agent("cfg", nixl_agent_config(backends=["UCX"]))
    monkeypatch.setenv("HMC_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="missing.toml"):
        nixl_agent("cfg", nixl_agent_config(backends=["UCX"]))


TWO_PEERS = os.path.join(HERE, "nixl_two_peers.py")
TWO_PEERS_EXPECTED = {"metadata_ready": True, "state": "DONE", "bytes": True,
                      "target_saw_invalidate": True, "end": "ok"}


def run_two_peers(python, package, env=None):
    out = subprocess.run([python, TWO_PEERS, package], capture_output=True, text=True, timeout=120,
                         env=env)
    got = {ln.split(" ", 2)[1]: json.loads(ln.split(" ", 2)[2]) for ln in out.stdout.splitlines() if ln.startswith("RESULT ")}
    assert got.get("end") == "ok", f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return got


def test_peers_find_each_other_through_their_listen_threads():
    """basic_two_peers.py's flow: fetch_remote_metadata, send_local_metadata, descriptors
    sent in a notification, initialize_xfer, invalidate_local_metadata; on hmc.nixl, and
    unmodified (`import nixl`) through the alias."""
    assert run_two_peers(sys.executable, "hmc.nixl") == TWO_PEERS_EXPECTED
    assert run_two_peers(sys.executable, "nixl", dict(os.environ, HMC_ALIAS="nixl")) == TWO_PEERS_EXPECTED


@pytest.mark.skipif(not os.environ.get("HMC_NIXL_PYTHON"), reason="HMC_NIXL_PYTHON (NIXL 1.5.1) not given")
def test_nixl_itself_finds_peers_the_same_way():
    assert run_two_peers(os.environ["HMC_NIXL_PYTHON"], "nixl_cu12") == TWO_PEERS_EXPECTED


def test_a_listener_bounds_what_a_peer_sends():
    """A message over MAX_MESSAGE_BYTES is refused from its header (nothing more is read)
    and metadata that is not an hmc agent's is not loaded; the listener keeps serving."""
    import socket
    import struct

    from hmc.nixl import _listen

    a = nixl_agent("listening", nixl_agent_config(True, True, 0))
    port = a._listener.port
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(struct.pack(">cI", b"S", _listen.MAX_MESSAGE_BYTES + 1))
        assert s.recv(1) == b""  # closed
    _listen.exchange("127.0.0.1", port, b"S", b"not metadata", False)
    md = _listen.exchange("127.0.0.1", port, b"F", b"listening", True)
    assert md == a.get_agent_metadata()
    a._listener.close()
    a._engine.finalize()


def start_prefill(backend="tcp"):
    p = subprocess.Popen([sys.executable, SCRIPT, "hmc.nixl", "prefill"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, NIXL_PATTERN_BACKEND=backend))
    words = next(line for line in p.stdout if line.startswith("MD ")).split()[1:]
    return p, bytes.fromhex(words[0]), int(words[1])


def test_a_restarted_peer_is_a_remote_disconnect_and_new_metadata_recovers():
    """The prefill process dies and a new one starts under the same agent name: a transfer
    prepared for the old one raises nixlRemoteDisconnectError (or ends "ERR"), never
    reaching the new process; remove_remote_agent and add_remote_agent of the new metadata
    make new lists that move the new process's bytes."""
    a = nixl_agent("decode", nixl_agent_config(backends=["tcp"]))
    dst = np.zeros(64 * 4096, np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data, dst.nbytes, 0)], "DRAM")
    p, md, addr = start_prefill()
    name = a.add_remote_agent(md)
    rh = a.prep_xfer_dlist(name, [(addr, dst.nbytes, 0)], "DRAM")
    h = a.make_prepped_xfer("READ", lh, [0], rh, [0])
    st = a.transfer(h)
    while st == "PROC":
        st = a.check_xfer_state(h)
    assert st == "DONE"
    p.kill()
    p.wait()
    q, md2, addr2 = start_prefill()
    try:
        dst[:] = 0
        try:
            st = a.transfer(h)
            while st == "PROC":
                st = a.check_xfer_state(h)
            assert st == "ERR", st
        except nb.nixlRemoteDisconnectError:
            pass
        assert not dst.any(), "no byte of the new process reached the old handle"
        a.release_xfer_handle(h)
        a.remove_remote_agent(name)
        assert a.add_remote_agent(md2) == name
        rh2 = a.prep_xfer_dlist(name, [(addr2, dst.nbytes, 0)], "DRAM")
        h2 = a.make_prepped_xfer("READ", lh, [0], rh2, [0])
        st = a.transfer(h2)
        while st == "PROC":
            st = a.check_xfer_state(h2)
        assert st == "DONE"
        want = np.random.default_rng(100).integers(0, 256, 64 * 4096, dtype=np.uint8)
        assert (dst == want).all()
        a.release_xfer_handle(h2)
    finally:
        q.stdin.close()
        q.wait(30)
        a._engine.finalize()


def test_agents_find_each_other_through_etcd(etcd, monkeypatch):
    """NIXL_ETCD_ENDPOINTS: send_local_metadata() publishes, fetch_remote_metadata(name)
    finds the agent by name (in the background, as NIXL's watch); bytes and notifications
    move between them."""
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://{etcd}")
    a = nixl_agent("etcd-a", nixl_agent_config(backends=["tcp"]))
    b = nixl_agent("etcd-b", nixl_agent_config(backends=["tcp"]))
    src = np.random.default_rng(4).integers(0, 256, 8192, dtype=np.uint8)
    dst = np.zeros(8192, np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    b.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    b.send_local_metadata()
    a.fetch_remote_metadata("etcd-b")
    end = time.monotonic() + 20
    while not a.check_remote_metadata("etcd-b"):
        assert time.monotonic() < end, "etcd-b not found through etcd"
        time.sleep(0.01)
    local = a.get_xfer_descs([(dst.ctypes.data, 8192, 0)], "DRAM")
    remote = a.get_xfer_descs([(src.ctypes.data, 8192, 0)], "DRAM")
    h = a.initialize_xfer("READ", local, remote, "etcd-b", b"via-etcd")
    st = a.transfer(h)
    while st == "PROC":
        st = a.check_xfer_state(h)
    assert st == "DONE" and (dst == src).all()
    end, got = time.monotonic() + 10, {}
    while not got and time.monotonic() < end:
        got = b.get_new_notifs()
    assert got == {"etcd-a": [b"via-etcd"]}
    a.release_xfer_handle(h)
    a._engine.finalize()
    b._engine.finalize()


def test_one_agent_from_many_threads():
    """Thread-safe by default (NIXL's agent is not without a sync mode): 8 threads each
    prepare, post and check their own READs on one agent, and every byte lands."""
    import threading

    p, md, addr = start_prefill()
    a = nixl_agent("threads", nixl_agent_config(backends=["tcp"]))
    try:
        name = a.add_remote_agent(md)
        dsts = [np.zeros(64 * 4096, np.uint8) for _ in range(8)]
        a.register_memory([(d.ctypes.data, d.nbytes, 0, "") for d in dsts], "DRAM")
        rh = a.prep_xfer_dlist(name, [(addr + b * 4096, 4096, 0) for b in range(64)], "DRAM")
        want = np.random.default_rng(100).integers(0, 256, 64 * 4096, dtype=np.uint8)
        errors = []

        def work(d):
            try:
                lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(d.ctypes.data + b * 4096, 4096, 0) for b in range(64)], "DRAM")
                for _ in range(5):
                    d[:] = 0
                    h = a.make_prepped_xfer("READ", lh, list(range(64)), rh, list(range(64)), b"t")
                    st = a.transfer(h)
                    while st == "PROC":
                        st = a.check_xfer_state(h)
                    assert st == "DONE" and (d == want).all()
                    a.release_xfer_handle(h)
                a.get_new_notifs()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(d,)) for d in dsts]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors[0]
    finally:
        p.stdin.close()
        p.wait(30)
        a._engine.finalize()


@pytest.mark.parametrize("word, level, warned", [
    ("TRACE", "DEBUG", False), ("warn", "WARNING", False), ("FATAL", "CRITICAL", False),
    ("loud", "INFO", True),
])
def test_nixl_log_level_is_read_as_nixl_reads_it(word, level, warned):
    code = ("import logging; from hmc.nixl.logging import get_logger; l = get_logger('_api'); "
            "print(l.name, logging.getLevelName(logging.getLogger('nixl').level))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, NIXL_LOG_LEVEL=word))
    assert r.stdout.splitlines()[-1].split() == ["nixl.api", level], r.stdout + r.stderr
    assert ("Invalid NIXL_LOG_LEVEL" in r.stdout) == warned
