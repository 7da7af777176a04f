"""``hmc.nixl`` where NIXL's own tests and stacks pin its behaviour: the agent core and its
name, an unknown operation before anything else, unknown plugin names, telemetry under
``NIXL_TELEMETRY_ENABLE``, errors in NIXL's classes (a limit, a truncated blob, a missing
driver, a peer gone), a prepared list released twice, descriptor lists kept as arrays, the
lazy alias (nothing in ``sys.modules`` before the first import) and the transport named in
the log. NIXL's suite itself runs through ``upstream/run_nixl_suite.py``."""

import os
import subprocess
import sys

import numpy as np
import pytest

from hmc.nixl import _bindings as nb
from hmc.nixl._api import nixl_agent, nixl_agent_config


def agent_pair():
    a = nixl_agent("conf-a", nixl_agent_config(backends=["tcp"]))
    b = nixl_agent("conf-b", nixl_agent_config(backends=["tcp"]))
    return a, b


def test_an_empty_name_is_a_value_error_as_nixls_binding_raises():
    with pytest.raises(ValueError, match="non-empty name"):
        nixl_agent("")


def test_an_unknown_operation_is_a_key_error_before_anything_else():
    # No backend at all: the operation is checked first, as NIXL's nixl_ops lookup.
    empty = nixl_agent("no-backend", nixl_agent_config(backends=[]))
    with pytest.raises(KeyError):
        empty.make_prepped_xfer("RD", 0, [], 0, [])
    lists = nb.nixlXferDList(nb.DRAM_SEG), nb.nixlXferDList(nb.DRAM_SEG)
    with pytest.raises(KeyError):
        empty.initialize_xfer("WR", *lists, "nobody")
    # A known operation gets as far as the missing backend.
    with pytest.raises(nb.nixlNotAllowedError, match="no backend"):
        empty.initialize_xfer("WRITE", *lists, "nobody")


def test_unknown_plugin_and_backend_names_answer_empty():
    a = nixl_agent("plugins", nixl_agent_config(backends=["tcp"]))
    assert a.get_plugin_mem_types("UVX") == [] and a.get_plugin_params("UVX") == {}
    assert a.get_backend_mem_types("UVX") == [] and a.get_backend_params("UVX") == {}
    assert a.get_plugin_mem_types("UCX") == ["DRAM", "VRAM"]
    assert a.get_backend_mem_types("tcp") == ["DRAM", "VRAM"]
    with pytest.raises(nb.nixlNotFoundError):
        a.create_backend("UVX")


@pytest.mark.parametrize("sync_mode", [None, *nb.nixl_thread_sync_t])
def test_the_core_gets_nixls_config_record(monkeypatch, sync_mode):
    from hmc.nixl._api import nixl_thread_sync_t

    seen = {}
    real = nb.nixlAgent

    def spy(name, config):
        seen["config"] = config
        return real(name, config)

    monkeypatch.setattr(nb, "nixlAgent", spy)
    mode = None if sync_mode is None else nixl_thread_sync_t(sync_mode)
    nixl_agent("spied", nixl_agent_config(backends=[], sync_mode=mode))
    want = nb.NIXL_THREAD_SYNC_NONE if mode is None else mode.value
    assert seen["config"].syncMode == want


def _two_agents_with_halves(prefix: str, capture: bool):
    """Agents ``<prefix>-a`` (telemetry per ``capture``) and ``<prefix>-b`` with 128 bytes
    each, a connected to b; the two adjacent 64-byte halves of each side's bytes. The caller
    keeps b (returned last): collected, its engine would end."""
    a = nixl_agent(f"{prefix}-a", nixl_agent_config(backends=["tcp"], capture_telemetry=capture))
    b = nixl_agent(f"{prefix}-b", nixl_agent_config(backends=["tcp"]))
    src, dst = np.arange(128, dtype=np.uint8), np.zeros(128, np.uint8)
    a.register_memory([(src.ctypes.data, 128, 0, "")], "DRAM")
    b.register_memory([(dst.ctypes.data, 128, 0, "")], "DRAM")
    name = a.add_remote_agent(b.get_agent_metadata())
    halves = lambda m: [(m.ctypes.data, 64, 0), (m.ctypes.data + 64, 64, 0)]  # noqa: E731
    return a, name, src, dst, halves(src), halves(dst), b


def _run_to_done(agent, handle):
    st = agent.transfer(handle)
    while st == "PROC":
        st = agent.check_xfer_state(handle)
    assert st == "DONE"


def _one_transfer(capture: bool):
    """One WRITE with a notification between two agents; the initiator's telemetry or the
    error NIXL raises without it."""
    a, name, src, dst, half, there, _b = _two_agents_with_halves("tele", capture)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(half, "DRAM"), a.get_xfer_descs(there, "DRAM"), name, b"t")
    _run_to_done(a, h)
    assert (dst == src).all()
    try:
        return a.get_xfer_telemetry(h)
    except nb.nixlNoTelemetryError as e:
        return e
    finally:
        a.release_xfer_handle(h)


@pytest.mark.parametrize(
    "env, capture, on",
    [(None, False, False), (None, True, True), ("y", False, True), ("YES", False, True),
     ("no", True, False), ("0", True, False)],
)
def test_telemetry_follows_nixl_telemetry_enable_over_the_config(monkeypatch, env, capture, on):
    if env is None:
        monkeypatch.delenv("NIXL_TELEMETRY_ENABLE", raising=False)
    else:
        monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", env)
    got = _one_transfer(capture)
    if not on:
        assert isinstance(got, nb.nixlNoTelemetryError)
        return
    # The caller's two descriptors, as NIXL counts them (adjacent: the engine merges them).
    assert (got.descCount, got.totalBytes) == (2, 128)
    assert got.startTime > 0 and got.xferDuration >= got.postDuration > 0


def test_a_telemetry_word_nixl_does_not_know_is_refused(monkeypatch):
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "maybe")
    with pytest.raises(RuntimeError, match="maybe.*positive.*negative"):
        nixl_agent("bad-word", nixl_agent_config(backends=[]))


def test_errors_take_nixls_classes_and_remote_disconnect_means_a_peer_gone():
    a, b = agent_pair()
    buf = np.zeros(4096, np.uint8)
    b.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    md = b.get_agent_metadata()
    a.add_remote_agent(md)
    # Over the notification limit: a bad argument of the caller's, refused before sending.
    with pytest.raises(nb.nixlInvalidParamError, match="max_notify_len"):
        a.send_notif("conf-b", b"x" * (1 << 20))
    a.send_notif("conf-b", b"fits")
    # Truncated metadata, in its header and in its body: a mismatch, not a disconnect.
    for cut in (9, len(md) // 2, len(md) - 1):
        with pytest.raises(nb.nixlMismatchError):
            nixl_agent(f"cut-{cut}", nixl_agent_config(backends=["tcp"])).add_remote_agent(md[:cut])
    # The peer going away is what remote disconnect is kept for.
    b._engine.finalize()
    with pytest.raises(nb.nixlRemoteDisconnectError):
        a.send_notif("conf-b", b"gone?")


def _cuda_driver_loads() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_cuda_driver_loads(), reason="this host has a CUDA driver")
def test_a_missing_cuda_driver_is_a_backend_error():
    a = nixl_agent("no-driver", nixl_agent_config(backends=["tcp"]))
    with pytest.raises(nb.nixlBackendError, match="CUDA driver"):
        a.register_memory([(0x10000, 4096, 0, "")], "VRAM")


def test_a_prepared_list_released_twice_is_refused():
    a = nixl_agent("twice", nixl_agent_config(backends=["tcp"]))
    buf = np.zeros(256, np.uint8)
    a.register_memory([(buf.ctypes.data, 256, 0, "")], "DRAM")
    h = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(buf.ctypes.data, 256, 0)], "DRAM")
    a.release_dlist_handle(h)
    with pytest.raises(nb.nixlInvalidParamError, match="released already"):
        a.release_dlist_handle(h)


def test_an_array_built_list_keeps_the_array_and_reads_as_rows():
    rows = np.array([[0x1000, 64, 0], [0x2000, 32, 1]], dtype=np.uint64)
    d = nb.nixlXferDList(nb.DRAM_SEG, rows)
    assert d._array() is d._arr and d._rows is None  # no Python object per row
    assert len(d) == 2 and d[1] == (0x2000, 32, 1) and list(d) == [(0x1000, 64, 0), (0x2000, 32, 1)]
    assert d == nb.nixlXferDList(nb.DRAM_SEG, [(0x1000, 64, 0), (0x2000, 32, 1)])
    d.addDesc((0x3000, 16, 0))  # changed row by row: rows from then on
    assert d.descCount() == 3 and d._array().tolist()[2] == [0x3000, 16, 0]
    reg = nb.nixlRegDList(nb.DRAM_SEG, rows.astype(np.int64))
    assert reg[0] == (0x1000, 64, 0, "")
    with pytest.raises(nb.nixlInvalidParamError, match="not negative"):
        nb.nixlXferDList(nb.DRAM_SEG, np.array([[-1, 64, 0]]))
    with pytest.raises(nb.nixlInvalidParamError, match="integers"):
        nb.nixlXferDList(nb.DRAM_SEG, np.zeros((1, 3)))


def _py(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HMC_ALIAS", "HMC_CONFIG"))}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_the_alias_puts_nothing_in_sys_modules_before_the_first_import():
    # vLLM's check before it sets UCX variables: "NIXL was already imported".
    r = _py("import sys; before = 'nixl' in sys.modules or 'hmc' in sys.modules; import nixl; "
            "print(before, 'nixl' in sys.modules, nixl.__name__, nixl.__spec__.name)", HMC_ALIAS="nixl")
    assert r.stdout.split() == ["False", "True", "hmc.nixl", "hmc.nixl"], r.stderr


def test_the_log_names_the_transport_in_use(tmp_path):
    cfg = tmp_path / "hmc.toml"
    cfg.write_text('transport = "tcp"\n')
    r = _py("from hmc.nixl._api import nixl_agent; nixl_agent('logged')",
            HMC_CONFIG=str(cfg), NIXL_LOG_LEVEL="INFO")
    assert "Backend UCX was instantiated (hmc transport tcp)" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_new_error_classes_keep_what_callers_caught_before():
    import hmc

    # Each is an UnavailableError, as these failures were before the classes existed.
    for cls in (hmc.PeerGoneError, hmc.BackendUnavailableError, hmc.MismatchError):
        assert issubclass(cls, hmc.UnavailableError) and issubclass(cls, ConnectionError)


def test_a_version_check_sees_no_nixl_distribution():
    # What vLLM's check_nixl_version sees under the alias (the guide's
    # port-from-nixl-mooncake.md says so, "Version checks"): no `nixl`
    # distribution; hmc's own is there under its name.
    r = _py("import importlib.metadata as m, nixl\n"
            "try:\n    m.version('nixl'); print('found')\n"
            "except m.PackageNotFoundError:\n    print('none', m.version('hmc'))", HMC_ALIAS="nixl")
    assert r.stdout.split()[0] == "none" and len(r.stdout.split()) == 2, r.stdout + r.stderr


@pytest.mark.parametrize("skip_merge, want", [(False, 1), (True, 2)])
def test_a_prepared_transfers_telemetry_counts_descriptors_as_nixl_merges_them(skip_merge, want):
    # make_prepped_xfer merges adjacent descriptors unless skip_desc_merge (NIXL's count:
    # vLLM's num_descriptors metric reads it); initialize_xfer's are counted as given
    # (test_telemetry_follows_nixl_telemetry_enable_over_the_config).
    a, name, src, dst, half, there, _b = _two_agents_with_halves("merge", True)
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", half, "DRAM")
    remote = a.prep_xfer_dlist(name, there, "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0, 1], remote, [0, 1], skip_desc_merge=skip_merge)
    _run_to_done(a, h)
    assert (dst == src).all()
    assert a.get_xfer_telemetry(h).descCount == want
    a.release_xfer_handle(h)
