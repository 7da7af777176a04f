#!/usr/bin/env python3
"""SGLang 0.5.23's disaggregation connectors, run for real between two processes on CPU memory.

    python sglang_disagg.py --backend mooncake|nixl --package hmc|real [--requests N]

Spawns a prefill process and a decode process. Each one builds SGLang's own objects the way
SGLang's prefill and decode schedulers do (``disaggregation/prefill.py`` and ``decode.py``,
``_init_kv_manager``): ``ServerArgs`` published with ``runtime_context.publish``, the
``--disaggregation-transfer-backend`` hook (``handle_pd_disaggregation``: ``mooncake_tcp`` sets
``MC_FORCE_TCP=1``), ``start_disagg_service`` for the bootstrap server (prefill),
``maybe_init_shared_mooncake_transfer_engine`` for the Mooncake engine, a real
``MHATokenToKVPool`` and ``MetadataBuffers`` (both on ``device="cpu"``), ``KVArgs`` filled from
them, then ``MooncakeKVManager`` / ``NixlKVManager`` with their ``KVSender`` (prefill: poll to
WaitingForInput, ``init``, ``send`` in chunks, poll to Success, ``clear``) and ``KVReceiver``
(decode: ``try_ensure_parallel_info``, ``init``, poll, ``send_metadata``, poll to Success,
``clear``). The decode process then checks every byte of every KV page and every aux row
moved against what the prefill wrote.

What stands in for a GPU: the KV pool is SGLang's ``MHATokenToKVPool`` on ``device="cpu"``
(not CUDA), ``ServerArgs(model_path="dummy", device="cpu")`` (no model is loaded; the KV shape
is the harness's: 8 layers, 8 KV heads of 64, bf16, page size 16), NIXL's KV memory kind
``DRAM`` (``kv_data_mem_kinds``, SGLang's own field, host KV) where a GPU server registers
``VRAM``; no forward pass runs: the prefill fills its pool with seeded random bytes and the
aux rows (``MetadataBuffers``) with seeded bytes plus the bootstrap room, where a model would
write the KV and the first token.

``--package hmc`` runs on hmc's work-alikes (``HMC_ALIAS=mooncake`` / ``HMC_ALIAS=nixl`` with
``HMC_ALIAS_OVERRIDE=1``, so they win over a real package installed beside them);
``--package real`` on ``mooncake-transfer-engine-non-cuda==0.3.13.post1`` /
``nixl-cu12==1.5.1`` (imported as ``nixl`` through a shim package, made here if absent).
The Mooncake backend runs twice unless ``--transfer-backend`` says which:
``mooncake_tcp`` (SGLang's way to run without RDMA: ``MC_FORCE_TCP=1``, protocol ``rdma``
still passed) and ``mooncake`` (SGLang's default: ``MOONCAKE_PROTOCOL`` unset, so ``rdma``,
on a host without an RDMA device).

Prints one JSON line per run: ``system``, ``backend``, ``transfer_backend``, ``requests``,
``bytes_checked``, ``bytes_ok``, ``requests_per_s``, ``gib_per_s``; exits non-zero on a wrong
byte or a failed request.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The harness's model: KV shape and request mix (both processes derive the same from these).
LAYERS = 8
HEADS = 8
HEAD_DIM = 64
PAGE = 16
POOL_PAGES = 384  # usable pages 1..POOL_PAGES-1 (page 0 is SGLang's padding slot)
MIN_PAGES, MAX_PAGES = 4, 32
CHUNK_PAGES = 16  # prefill sends a request in chunks of this many pages (chunked prefill)
WINDOW = 8  # requests in flight per side
WARMUP = 4
SEED = 56

RESULT_TAG = "SGLANG_DISAGG_RESULT "


# ---------------------------------------------------------------------------------------------
# The orchestrating process
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


NIXL_SHIM = '''"""`nixl` for nixl-cu12 1.5.1, which installs as `nixl_cu12`: made by hmc's
compat/sglang_disagg.py so that SGLang's `import nixl._api` finds the real package."""
import importlib as _importlib
import sys as _sys

for _sub in ("_bindings", "_utils", "logging", "_api"):
    _sys.modules[__name__ + "." + _sub] = _importlib.import_module("nixl_cu12." + _sub)
from nixl_cu12 import *  # noqa: E402,F401,F403
from nixl_cu12 import __all__  # noqa: E402,F401
'''


def ensure_nixl_shim() -> str:
    """The `nixl` package that re-exports nixl_cu12 (made in this interpreter's site-packages)."""
    path = os.path.join(_site_packages(), "nixl", "__init__.py")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(NIXL_SHIM)
    return path


def _child_env(backend: str, package: str) -> dict:
    env = dict(os.environ)
    for key in ("HMC_ALIAS", "HMC_ALIAS_OVERRIDE", "MC_FORCE_TCP", "MOONCAKE_PROTOCOL"):
        env.pop(key, None)
    env["SGLANG_HOST_IP"] = "127.0.0.1"  # SGLang's get_local_ip_auto: bind and publish loopback
    env.setdefault("PYTHONWARNINGS", "ignore")
    if package == "hmc":
        env["HMC_ALIAS"] = backend
        env["HMC_ALIAS_OVERRIDE"] = "1"  # the real package may be installed beside hmc
    return env


def run_pair(args, transfer_backend: str) -> dict:
    backend = args.backend
    bport = _free_port()
    cfg = {
        "backend": backend,
        "package": args.package,
        "transfer_backend": transfer_backend,
        "bootstrap_port": bport,
        "http_port": _free_port(),
        "requests": args.requests,
        "deadline": args.timeout - 60,
        "kill_after": args.kill_decode_after,
    }
    env = _child_env(backend, args.package)
    if args.kill_decode_after is not None:
        # The prefill's senders whose decode never published fail after this (SGLang's
        # default is 300 s).
        env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = "5"
    logdir = tempfile.mkdtemp(prefix="sglang-disagg-")
    procs = {}
    logs = {}
    for role in ("prefill", "decode"):
        logs[role] = open(os.path.join(logdir, role + ".log"), "w+")
        procs[role] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", role, "--config", json.dumps(cfg)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logs[role],
            text=True,
        )
    results = {}
    try:
        out, _ = procs["decode"].communicate(timeout=args.timeout)
        results["decode"] = _result_line(out)
        # The prefill serves until the decode is done: closing its stdin ends it.
        out, _ = procs["prefill"].communicate(input="", timeout=60)
        results["prefill"] = _result_line(out)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack to the log
                time.sleep(1)
                p.kill()
                p.wait()
    dec, pre = results.get("decode"), results.get("prefill")
    if args.kill_decode_after is not None:
        return _kill_line(args, transfer_backend, dec, pre, procs, logs, logdir)
    ok = (
        dec is not None
        and pre is not None
        and dec.get("bytes_ok") is True
        and dec.get("failed", 1) == 0
        and pre.get("failed", 1) == 0
        and procs["decode"].returncode == 0
        and procs["prefill"].returncode == 0
    )
    line = {
        "system": (dec or pre or {}).get("system", f"{args.package} {backend}"),
        "backend": backend,
        "transfer_backend": transfer_backend,
        "requests": args.requests,
        "bytes_checked": (dec or {}).get("bytes_checked", 0),
        "bytes_ok": bool(ok),
        "requests_per_s": (dec or {}).get("requests_per_s"),
        "gib_per_s": (dec or {}).get("gib_per_s"),
        "module": (dec or pre or {}).get("module"),
        "prefill_requests_per_s": (pre or {}).get("requests_per_s"),
    }
    if not ok:
        for role in ("prefill", "decode"):
            logs[role].seek(0)
            tail = logs[role].read()[-4000:]
            line.setdefault("errors", {})[role] = (results.get(role) or {}).get("error") or (
                f"exit {procs[role].returncode}"
            )
            sys.stderr.write(f"--- {role} log tail ({logs[role].name}) ---\n{tail}\n")
        if dec and dec.get("mismatches"):
            line["mismatches"] = dec["mismatches"]
    for f in logs.values():
        f.close()
    if ok:
        shutil.rmtree(logdir, ignore_errors=True)  # kept (and named above) when a run failed
    return line


def _kill_line(args, transfer_backend, dec, pre, procs, logs, logdir) -> dict:
    """--kill-decode-after K: the decode leaves (os._exit) right after publishing the
    destination of timed request K (0-based), with others in flight; the prefill, whose
    forward pass for that request takes 2 s, must conclude every request (that one Failed
    with SGLang's reason for a dead peer, not a timeout) and not hang."""
    total = WARMUP + args.requests
    ok = (
        pre is not None
        and pre.get("concluded") == total
        and dec is not None
        and dec.get("bytes_ok") is True
        and procs["decode"].returncode == 3
    )
    line = {
        "system": (dec or pre or {}).get("system", f"{args.package} {args.backend}"),
        "backend": args.backend,
        "transfer_backend": transfer_backend,
        "scenario": f"decode exits once request {WARMUP + args.kill_decode_after} of {total} is "
        "published (the prefill's KV for it leaves 2 s after)",
        "ok": bool(ok),
        "decode_bytes_ok": (dec or {}).get("bytes_ok"),
        "prefill_succeeded": (pre or {}).get("succeeded"),
        "prefill_failed": (pre or {}).get("failed"),
        "prefill_failure_reasons": (pre or {}).get("failure_reasons"),
        "prefill_failure_of_the_published_request": (pre or {}).get("kill_request_failure"),
    }
    if not ok:
        for role in ("prefill", "decode"):
            logs[role].seek(0)
            sys.stderr.write(f"--- {role} log tail ({logs[role].name}) ---\n{logs[role].read()[-4000:]}\n")
    for f in logs.values():
        f.close()
    if ok:
        shutil.rmtree(logdir, ignore_errors=True)
    return line


def _result_line(out: str):
    for line in reversed((out or "").splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    return None


def orchestrate(args) -> int:
    if args.package == "real" and args.backend == "nixl":
        ensure_nixl_shim()
    if args.transfer_backend:
        variants = [args.transfer_backend]
    elif args.backend == "mooncake":
        variants = ["mooncake_tcp", "mooncake"]
    else:
        variants = ["nixl"]
    rc = 0
    for tb in variants:
        line = run_pair(args, tb)
        print(json.dumps(line), flush=True)
        if not line.get("bytes_ok", line.get("ok")):
            rc = 1
    return rc


# ---------------------------------------------------------------------------------------------
# The prefill and decode processes
# ---------------------------------------------------------------------------------------------


def request_plan(n_timed: int):
    """(room, src_pages) per request, warm-up first; both processes compute the same list."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    plan = []
    for _ in range(WARMUP + n_timed):
        room = int(rng.integers(1, 2**63 - 1))
        n = int(rng.integers(MIN_PAGES, MAX_PAGES + 1))
        if rng.random() < 0.5:  # one contiguous run
            start = int(rng.integers(1, POOL_PAGES - n))
            pages = np.arange(start, start + n, dtype=np.int64)
        else:  # scattered pages, as a long-running pool hands them out
            pages = rng.choice(np.arange(1, POOL_PAGES, dtype=np.int64), size=n, replace=False)
        plan.append((room, pages))
    return plan


def aux_row(room: int, i: int, nbytes: int, is_room_buffer: bool):
    """Aux buffer ``i``'s row for ``room``: seeded bytes; MetadataBuffers.bootstrap_room's row
    starts with the room, as set_buf writes it."""
    import torch

    g = torch.Generator().manual_seed((room * 31 + i) % (2**63))
    row = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    if is_room_buffer:
        row[:8] = torch.tensor([room], dtype=torch.int64).view(torch.uint8)
    return row


def fill_pool(pool):
    """The prefill's KV: seeded random bits in every K and V buffer (int16 view of bf16)."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    for buf in list(pool.k_buffer) + list(pool.v_buffer):
        v = buf.view(torch.int16)
        v.copy_(torch.randint(-(2**15), 2**15, v.shape, dtype=torch.int16, generator=g))


def role_main(role: str, cfg: dict) -> int:
    import faulthandler
    import logging
    import warnings

    faulthandler.register(signal.SIGUSR1, all_threads=True)

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import numpy as np
    import torch

    from sglang.srt import runtime_context as rc
    from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import (
        DisaggregationMode,
        KVClassType,
        MetadataBuffers,
        ReqToMetadataIdxAllocator,
        TransferBackend,
        get_kv_class,
        get_kv_transfer_buf_infos,
        get_pd_kv_layout,
        setup_state_kv_args,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.server_args import ServerArgs

    result = {"role": role, "failed": 0}
    backend_name = cfg["backend"]

    def emit(extra=None, code=0):
        if extra:
            result.update(extra)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return code

    # ServerArgs as `python -m sglang.launch_server --disaggregation-mode ROLE
    # --disaggregation-transfer-backend TB --device cpu` would have them; a "dummy" model
    # returns from resolution before the PD hook runs, so run SGLang's hook here (the same
    # function resolve_once calls for a real model).
    sa = ServerArgs(
        model_path="dummy",
        disaggregation_mode=role,
        disaggregation_transfer_backend=cfg["transfer_backend"],
        device="cpu",
        host="127.0.0.1",
        port=cfg["http_port"],
        disaggregation_bootstrap_port=cfg["bootstrap_port"],
    )
    handle_pd_disaggregation(sa)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    # One rank, no torch.distributed: the pipeline group the prefill manager keeps (and uses
    # only when pp_size > 1) is not built; state it as absent.
    rc.get_parallel().override_permanently(pp_group=None)
    disagg = rc.get_disagg()
    transfer_backend = TransferBackend(disagg.disaggregation_transfer_backend)
    mode = DisaggregationMode(role)
    result["mc_force_tcp"] = os.environ.get("MC_FORCE_TCP")

    # Which package answers the names SGLang imports.
    from importlib import import_module
    from importlib.metadata import version

    mod = import_module("mooncake.engine" if backend_name == "mooncake" else "nixl._api")
    result["module"] = getattr(mod, "__file__", None) or mod.__name__

    if cfg["package"] == "hmc":
        result["system"] = f"hmc.{backend_name} (hmc {version('hmc')})"
    else:
        dist = "mooncake-transfer-engine-non-cuda" if backend_name == "mooncake" else "nixl-cu12"
        result["system"] = f"{dist} {version(dist)}"

    try:
        if mode == DisaggregationMode.PREFILL:
            from sglang.srt.managers.disagg_service import start_disagg_service

            bootstrap_server = start_disagg_service()  # noqa: F841 (serves in its thread)
        if transfer_backend == TransferBackend.MOONCAKE:
            from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
                maybe_init_shared_mooncake_transfer_engine,
            )

            maybe_init_shared_mooncake_transfer_engine(gpu_id=0)

        pool = MHATokenToKVPool(
            size=(POOL_PAGES - 1) * PAGE,
            page_size=PAGE,
            dtype=torch.bfloat16,
            head_num=HEADS,
            head_dim=HEAD_DIM,
            layer_num=LAYERS,
            device="cpu",
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        metadata = MetadataBuffers(
            WINDOW * 2,
            hidden_size=256,
            hidden_states_dtype=torch.bfloat16,
            max_sampling_mask_tokens=16,
        )
        if mode == DisaggregationMode.PREFILL:
            fill_pool(pool)

        # KVArgs as prefill.py / decode.py _init_kv_manager fill them.
        kv_args = get_kv_class(transfer_backend, KVClassType.KVARGS)()
        kv_args.engine_rank = 0
        kv_args.pp_rank = 0
        kv_args.system_dp_rank = rc.get_parallel().dp_rank
        kv_args.rust_http_port = None
        kv_args.kv_cache_dtype_str = "auto"
        kv_args.kv_layout = get_pd_kv_layout(pool)
        kv_args.prefill_start_layer = 0
        kv_args.prefill_end_layer = getattr(pool, "end_layer", None)
        ptrs, lens, items = get_kv_transfer_buf_infos(pool)
        kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = ptrs, lens, items
        kv_args.num_draft_entries = 0
        kv_args.kv_layer_ids = []
        kv_args.kv_head_num = pool.head_num
        kv_args.total_kv_head_num = HEADS
        kv_args.page_size = PAGE
        if transfer_backend == TransferBackend.NIXL:
            kv_args.kv_data_mem_kinds = ["DRAM"] * len(ptrs)  # host KV, not VRAM
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = (
            metadata.get_buf_infos()
        )
        kv_args.ib_device = disagg.disaggregation_ib_device
        kv_args.gpu_id = rc.get_device().gpu_id
        setup_state_kv_args(kv_args, pool, None, LAYERS)

        manager = get_kv_class(transfer_backend, KVClassType.MANAGER)(
            kv_args, mode, sa, False
        )
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return emit({"error": f"{type(e).__name__}: {e}", "failed": 1}, 1)

    plan = request_plan(cfg["requests"])
    index = {room: i for i, (room, _) in enumerate(plan)}
    kill_at = WARMUP + cfg["kill_after"] if cfg.get("kill_after") is not None else len(plan)
    aux_item_lens = list(kv_args.aux_item_lens)
    aux_bufs = _aux_buffers(metadata)
    bootstrap_addr = f"127.0.0.1:{cfg['bootstrap_port']}"
    meta_alloc = ReqToMetadataIdxAllocator(WINDOW * 2)
    kv_bufs = list(pool.k_buffer) + list(pool.v_buffer)
    page_bytes = sum(b[:PAGE].nbytes for b in kv_bufs)

    if mode == DisaggregationMode.PREFILL:
        sender_cls = get_kv_class(transfer_backend, KVClassType.SENDER)

        def start(room, pages):
            return {"conn": sender_cls(manager, bootstrap_addr, room)}

        def publish(room, pages, st):
            """What the prefill scheduler does once the decode's destination is known: the
            first token's metadata (MetadataBuffers.set_buf's place), KVSender.init, then the
            pages chunk by chunk (send_kv_chunk; the last chunk carries the aux index)."""
            if index[room] == kill_at:
                # --kill-decode-after: this forward pass takes long enough for the decode
                # to be gone before the KV leaves.
                time.sleep(2.0)
            st["aux"] = meta_alloc.alloc()
            for i, (buf, n) in enumerate(zip(aux_bufs, aux_item_lens)):
                buf[st["aux"]].view(torch.uint8).copy_(aux_row(room, i, n, i == len(aux_bufs) - 1))
            st["conn"].init(len(pages), st["aux"])
            for c in range(0, len(pages), CHUNK_PAGES):
                st["conn"].send(pages[c : c + CHUNK_PAGES])

        def finish(room, pages, st):
            st["conn"].clear()
            meta_alloc.free(st["aux"])

    else:
        receiver_cls = get_kv_class(transfer_backend, KVClassType.RECEIVER)
        image = _prefill_image(pool, fill_pool, torch)
        dst_views = [_pages(b, torch) for b in kv_bufs]
        src_views = [_pages(b, torch) for b in image]
        rng = np.random.default_rng(SEED + 1)
        free = list(range(1, POOL_PAGES))
        rng.shuffle(free)
        deadline = time.time() + 60
        _wait_http(f"http://{bootstrap_addr}/health", deadline)
        while not manager.try_ensure_parallel_info(bootstrap_addr):
            if time.time() > deadline:
                return emit({"error": "no prefill parallel info from the bootstrap server", "failed": 1}, 1)
            time.sleep(0.1)
        checked = {"bytes": 0, "bad": 0, "notes": []}

        def start(room, pages):
            r = receiver_cls(mgr=manager, bootstrap_addr=bootstrap_addr, bootstrap_room=room)
            r.init(0)  # prefill_dp_rank 0: one prefill rank
            return {"conn": r}

        def publish(room, pages, st):
            """decode.py's _send_kv_metadata: pages from the free list (page ids as int32, as
            _transfer_page_indices makes them: the wire format), a metadata row."""
            st["dst"] = np.array([free.pop() for _ in range(len(pages))], dtype=np.int32)
            st["aux"] = meta_alloc.alloc()
            st["conn"].send_metadata(st["dst"], st["aux"], None)
            if index[room] == kill_at:
                # --kill-decode-after: this decode goes away once the prefill has its
                # destination (ZMQ given time to deliver), with requests in flight.
                time.sleep(0.5)
                emit({"bytes_checked": checked["bytes"], "bytes_ok": checked["bad"] == 0})
                os._exit(3)

        def finish(room, pages, st):
            """Every byte of every page and aux row, then the pages back to the free list."""
            dst = torch.from_numpy(st["dst"].astype(np.int64))
            src = torch.from_numpy(np.asarray(pages, dtype=np.int64))
            for b, (dv, sv) in enumerate(zip(dst_views, src_views)):
                if not torch.equal(dv[dst], sv[src]):
                    checked["bad"] += 1
                    _note(checked, f"room {room}: KV buffer {b}: {_bad_pages(dv[dst], sv[src], st['dst'])}")
                dv[dst] = 0  # the next owner of these pages sees zeros, not this request
            for i, (buf, n) in enumerate(zip(aux_bufs, aux_item_lens)):
                got = buf[st["aux"]].view(torch.uint8)
                if not torch.equal(got, aux_row(room, i, n, i == len(aux_bufs) - 1)):
                    checked["bad"] += 1
                    _note(checked, f"room {room}: aux buffer {i} row {st['aux']} differs")
                got.zero_()
            checked["bytes"] += len(pages) * page_bytes + sum(aux_item_lens)
            st["conn"].clear()
            meta_alloc.free(st["aux"])
            free.extend(int(p) for p in st["dst"])

    def run(reqs):
        """The scheduler's loop over its disaggregation queue: at most WINDOW requests open;
        each poll()ed once per round; WaitingForInput publishes, Success finishes, Failed
        takes the reason as the schedulers do (failure_exception)."""
        pending = list(reqs)
        active = {}
        failed = []
        t0 = time.perf_counter()
        deadline = time.time() + cfg["deadline"]
        while pending or active:
            while pending and len(active) < WINDOW:
                room, pages = pending.pop(0)
                active[room] = (pages, start(room, pages))
            progressed = False
            for room in list(active):
                pages, st = active[room]
                poll = st["conn"].poll()
                if poll == KVPoll.WaitingForInput and "aux" not in st:
                    publish(room, pages, st)
                elif poll == KVPoll.Success:
                    finish(room, pages, st)
                elif poll == KVPoll.Failed:
                    try:
                        st["conn"].failure_exception()
                    except Exception as e:  # noqa: BLE001 (KVTransferError: the reason)
                        failed.append((room, f"{type(e).__name__}: {e}"))
                    else:
                        failed.append((room, "Failed"))
                else:
                    continue
                progressed = True
                if poll != KVPoll.WaitingForInput:
                    del active[room]
            if time.time() > deadline:
                failed.extend((room, "timed out") for room in active)
                break
            if not progressed:
                time.sleep(0.0002)
        return time.perf_counter() - t0, failed
    _, failed = run(plan[:WARMUP])  # connections, first registrations: not timed
    elapsed, failed2 = run(plan[WARMUP:])
    failed += failed2
    n = len(plan) - WARMUP
    moved = sum(len(p) for _, p in plan[WARMUP:]) * page_bytes
    result.update(
        {
            "requests": n,
            "failed": len(failed),
            "requests_per_s": round(n / elapsed, 1),
            "gib_per_s": round(moved / elapsed / 2**30, 3),
            "elapsed_s": round(elapsed, 3),
        }
    )
    if failed:
        result["error"] = f"{len(failed)} request(s) failed, first: {failed[0][1]}"
        reasons = {}
        for _, why in failed:
            why = re.sub(r"\d{6,}", "N", str(why))[:200]
            reasons[why] = reasons.get(why, 0) + 1
        result["failure_reasons"] = reasons
    result["succeeded"] = len(plan) - len(failed)
    if kill_at < len(plan):
        why = dict(failed).get(plan[kill_at][0], "Success")
        result["kill_request_failure"] = re.sub(r"\d{6,}", "N", str(why))[:200]
    # run() returns once every request is Success or Failed, or at the harness's deadline
    result["concluded"] = len(plan) - sum(why == "timed out" for _, why in failed)
    if mode == DisaggregationMode.PREFILL:
        emit()
        sys.stdin.read()  # serve (bootstrap server, engine) until the decode is done
        return 0 if not failed else 1
    result["bytes_checked"] = checked["bytes"]
    if checked["notes"]:
        result["mismatches"] = checked["notes"]
        result.setdefault("error", checked["notes"][0])
    result["bytes_ok"] = checked["bad"] == 0 and not failed and checked["bytes"] > 0
    return emit(code=0 if result["bytes_ok"] else 1)


def _note(checked, text: str) -> None:
    if len(checked["notes"]) < 8:
        checked["notes"].append(text)


def _bad_pages(got, want, dst_pages) -> str:
    """Which destination pages hold the wrong bytes, and how wrong the first one is."""
    rows = (got != want).any(dim=1).nonzero().flatten().tolist()
    diff = (got[rows[0]] != want[rows[0]]).nonzero().flatten()
    zero = " (all zero)" if bool((got[rows[0]] == 0).all()) else ""
    return (
        f"{len(rows)} of {len(dst_pages)} pages differ; first, page {int(dst_pages[rows[0]])}: "
        f"{diff.numel()} of {got.shape[1]} int16 from element {int(diff[0])}{zero}"
    )


def _wait_http(url: str, deadline: float) -> None:
    """Until the prefill's bootstrap server answers (quiet: SGLang logs each refused try)."""
    import urllib.request

    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)


def _aux_buffers(metadata):
    """MetadataBuffers' tensors in get_buf_infos order (the aux buffers SGLang registers)."""
    bufs = [
        metadata.output_ids,
        metadata.cached_tokens,
        metadata.output_token_logprobs_val,
        metadata.output_token_logprobs_idx,
        metadata.output_top_logprobs_val,
        metadata.output_top_logprobs_idx,
        metadata.output_token_sampling_mask_len,
        metadata.output_token_sampling_mask_idx,
        metadata.output_token_sampling_logprobs,
        metadata.output_topk_p,
        metadata.output_topk_index,
        metadata.output_hidden_states,
    ]
    if metadata.output_dsa_topk_indices is not None:
        bufs.append(metadata.output_dsa_topk_indices)
    bufs.append(metadata.bootstrap_room)
    if metadata.kv_checksum is not None:
        bufs.append(metadata.kv_checksum)
    bufs = [b for b in bufs if b is not None]
    assert [b.data_ptr() for b in bufs] == metadata.get_buf_infos()[0]
    return bufs


def _prefill_image(pool, fill, torch):
    """The bytes the prefill's pool holds, rebuilt here (unregistered) to check against."""

    class _Image:
        pass

    img = _Image()
    img.k_buffer = [torch.empty_like(b) for b in pool.k_buffer]
    img.v_buffer = [torch.empty_like(b) for b in pool.v_buffer]
    fill(img)
    return img.k_buffer + img.v_buffer


def _pages(buf, torch):
    """A K or V buffer as [page, PAGE * heads * dim] int16 rows."""
    return buf.view(torch.int16).reshape(-1, PAGE * HEADS * HEAD_DIM)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["mooncake", "nixl"])
    ap.add_argument("--package", choices=["hmc", "real"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument(
        "--transfer-backend",
        choices=["mooncake", "mooncake_tcp", "nixl"],
        help="SGLang's --disaggregation-transfer-backend (default: both Mooncake ways, or nixl)",
    )
    ap.add_argument(
        "--timeout", type=float, default=900.0, help="seconds a prefill/decode pair may take"
    )
    ap.add_argument(
        "--kill-decode-after",
        type=int,
        metavar="K",
        help="a failure run: the decode exits after K timed requests with others in flight; "
        "checks that the prefill concludes every request (Failed, with SGLang's reason)",
    )
    ap.add_argument("--role", choices=["prefill", "decode"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        code = role_main(args.role, json.loads(args.config))
        # SGLang ends its scheduler processes by killing them (kill_process_tree); its
        # NixlKVManager's bootstrap thread is not a daemon, so a plain return never exits.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if not args.backend or not args.package:
        ap.error("--backend and --package are required")
    if args.transfer_backend and (args.transfer_backend == "nixl") != (args.backend == "nixl"):
        ap.error("--transfer-backend must match --backend")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
