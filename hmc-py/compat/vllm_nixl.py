#!/usr/bin/env python3
"""vLLM 0.33.0's real NixlConnector between two processes on CPU memory (issue 56, item 3).

    python vllm_nixl.py --package hmc|nixl|hmc,nixl [--mode pull|push|all] [--requests N]

Two processes, a prefill (``kv_producer``) and a decode (``kv_consumer``) instance, each run
vLLM's own ``Scheduler`` (which creates and drives the scheduler-side connector:
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``,
``request_finished``, ``update_connector_output``, heartbeats) and a worker-side connector made
by ``ensure_kv_transfer_initialized`` (vLLM's ``KVConnectorFactory``), whose KV caches come
from vLLM's ``create_kv_cache_views`` over one CPU int8 allocation, registered with
``register_kv_caches``, and which is driven every step through vLLM's model-runner mixin
(``KVConnectorModelRunnerMixin``: ``bind_connector_metadata``, ``start_load_kv``,
``wait_for_save``, ``get_transfer_results``, ...). The handshake metadata goes from the worker
to the scheduler's side channel as ``EngineCore._set_kv_connector_handshake_metadata`` does.
Only the model is missing: the "forward" of the prefill writes a known pattern into every KV
page of the blocks it computed, and samples a fixed token. The parent plays vLLM's
disaggregation proxy: it sends requests to the prefill with ``do_remote_decode``, and hands
the ``kv_transfer_params`` of each finished prefill to the decode as a new request.

The decode checks every byte of every block it received (each layer's page of each block)
against the pattern when the connector reports the request as received, before its model
step. ``pull``: the decode READs (``NixlPullConnector``, alias ``NixlConnector``); ``push``:
the decode registers its blocks by NIXL notification and the prefill WRITEs
(``NixlPushConnector``).

``--package hmc`` runs it on ``hmc.nixl`` through ``HMC_ALIAS=nixl`` (``import nixl`` is
hmc.nixl); ``--package nixl`` on ``nixl_cu12`` 1.5.1 through a small ``nixl`` package on
``PYTHONPATH`` that re-exports it as NIXL's own ``nixl`` meta package does (the meta package
would pick ``nixl_cu13`` next to vLLM's CUDA 13 torch). One JSON line per (system, mode);
exit status 1 on any wrong byte or missing request.
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# Model geometry (a small Llama: only its config is read; no weights exist).
LAYERS = 8
KV_HEADS = 8
HEAD_SIZE = 64
BLOCK_SIZE = 32
SAMPLED_TOKEN = 7

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": KV_HEADS * HEAD_SIZE,
    "intermediate_size": 1024,
    "num_attention_heads": KV_HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_SIZE,
    "num_hidden_layers": LAYERS,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "torch_dtype": "float16",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

NIXL_SHIM = '''"""A ``nixl`` package over ``nixl_cu12`` (what NIXL's ``nixl`` meta package does for the
backend wheel it picks), written by hmc-py/compat/vllm_nixl.py."""
import importlib
import sys

_pkg = importlib.import_module("nixl_cu12")
for _sub in ("_bindings", "_utils", "logging", "_api"):
    _mod = importlib.import_module("nixl_cu12." + _sub)
    sys.modules[__name__ + "." + _sub] = _mod
    globals()[_sub] = _mod
    for _attr in dir(_mod):
        if not _attr.startswith("__"):
            globals().setdefault(_attr, getattr(_mod, _attr))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------
# The child: one vLLM instance (scheduler + one worker), driven as EngineCore drives it.
# --------------------------------------------------------------------------------------


class Instance:
    def __init__(
        self,
        role: str,
        mode: str,
        num_blocks: int,
        model_dir: str,
        lease: int,
        step_delay: float,
        layout_name: str = "LBHNC",
    ):
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.distributed.kv_transfer.kv_transfer_state import (
            ensure_kv_transfer_initialized,
            get_kv_transfer_group,
        )
        from vllm.distributed.parallel_state import (
            init_distributed_environment,
            initialize_model_parallel,
        )
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            KVCacheTensor,
            compute_layout_strides,
            create_kv_cache_views,
        )
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        self.role = role
        self.mode = mode
        self.step_delay = step_delay
        model_config = ModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="float16", seed=0
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            max_model_len=4096,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        cache_config = CacheConfig(
            block_size=BLOCK_SIZE, cache_dtype="auto", enable_prefix_caching=False
        )
        # The layout the connector asks for (NixlConnector.get_required_kvcache_layout),
        # resolved here as the engine core would.
        cache_config.kv_cache_layout = layout_name
        connector = "NixlPushConnector" if mode == "push" else "NixlConnector"  # pull, sleep, heartbeat
        kv_transfer_config = KVTransferConfig(
            kv_connector=connector,
            kv_role="kv_producer" if role == "prefill" else "kv_consumer",
            kv_buffer_device="cpu",
            engine_id=f"{role}-{os.getpid()}",
            kv_connector_extra_config={"backends": ["UCX"], "kv_lease_duration": lease},
        )
        self.vllm_config = vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            kv_transfer_config=kv_transfer_config,
            device_config=DeviceConfig("cpu"),
        )
        if mode == "sleep" and role == "prefill":
            # Sleep mode: the worker makes its agent with no backend and then UCX with
            # "RCACHE_ENABLE=n,TLS=^cuda_ipc". vLLM's CPU platform refuses sleep mode in
            # ModelConfig's checks (no cumem allocator), so the flag is set after them.
            model_config.enable_sleep_mode = True
        self._cfg_ctx = set_current_vllm_config(vllm_config)
        self._cfg_ctx.__enter__()
        fd, self._dist_file = tempfile.mkstemp(prefix="vllm-nixl-dist-")
        os.close(fd)
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"file://{self._dist_file}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)

        # The KV cache: every layer's pages in one CPU allocation, as the model runner's
        # allocate_kv_cache lays them out (layer-outermost LBHNC).
        self.spec = spec = FullAttentionSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.float16,
        )
        self.layers = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        layout = KVCacheLayout[cache_config.kv_cache_layout]
        strides = compute_layout_strides(spec, num_blocks, LAYERS, layout)
        self.page = spec.page_size_bytes
        tensor = KVCacheTensor(
            size=self.page * num_blocks * LAYERS,
            layers=list(self.layers),
            layer_stride=strides[0],
            block_stride=strides[1],
        )
        self.kv_tensor = tensor
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[tensor],
            kv_cache_groups=[KVCacheGroupSpec(list(self.layers), spec)],
        )
        cache_config.num_gpu_blocks = num_blocks
        self.raw = torch.zeros(tensor.size, dtype=torch.int8)
        views = create_kv_cache_views(self.raw, spec, num_blocks, layout, tensor)
        self.kv_caches = dict(zip(self.layers, views))

        init_none_hash(sha256)
        self.hash_fn = sha256
        # Scheduler first (it starts the connector's side channel only once it has the
        # workers' handshake metadata), then the worker, then the metadata exchange.
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=self.kv_cache_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK_SIZE,
        )
        ensure_kv_transfer_initialized(vllm_config, self.kv_cache_config)
        self.connector = get_kv_transfer_group()
        self.connector.register_kv_caches(self.kv_caches)
        self.publish_handshake_metadata()

        # The pattern: one random page, plus a 64-bit number per (request, block, layer).
        gen = torch.Generator().manual_seed(56)
        self.base_page = torch.randint(
            -(2**62), 2**62, (self.page // 8,), dtype=torch.int64, generator=gen
        )
        self.written: dict[str, set[int]] = {}
        self.recv_blocks: dict[str, list[int]] = {}
        self.finished_at: dict[str, float] = {}
        self.stats = {"steps": 0, "bytes_checked": 0, "blocks_checked": 0, "bad_blocks": 0}
        self.kv_stats: dict[str, float] = {}

    def sleep_and_wake(self):
        """Worker.sleep (level 1) and Worker.wake_up for the KV cache, then EngineCore.wake_up's
        new handshake metadata: the KV memory is deregistered, its contents discarded,
        registered again, and the decode must handshake again (registration generation)."""
        self.connector.unregister_kv_caches()
        self.raw.zero_()
        self.connector.restore_kv_caches()
        self.publish_handshake_metadata()

    def publish_handshake_metadata(self):
        """EngineCore._set_kv_connector_handshake_metadata with the worker's
        get_kv_connector_handshake_metadata (pp_rank, tp_rank = 0, 0)."""
        metadata = self.connector.get_handshake_metadata()
        if metadata is not None:
            self.scheduler.get_kv_connector().set_xfer_handshake_metadata_pp_aware(
                {(0, 0): metadata}
            )

    # -- the pattern ------------------------------------------------------------------

    def expected(self, base_rid: str, j: int, layer: int):
        import hashlib

        k = int.from_bytes(
            hashlib.blake2b(f"{base_rid}/{j}/{layer}".encode(), digest_size=7).digest(), "little"
        )
        return self.base_page + k

    def page_of(self, block_id: int, layer: int):
        """The page of one layer of one block: contiguous in the layouts whose H, N and C
        axes come last in that order (LBHNC, BLHNC)."""
        t = self.kv_tensor
        start = t.offset + layer * t.layer_stride + block_id * t.block_stride
        return self.raw[start : start + self.page].view(self.torch.int64)

    # -- requests -----------------------------------------------------------------------

    def add_request(self, rid: str, prompt: list[int], max_tokens: int, params: dict):
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        req = Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=sp,
            pooling_params=None,
            mm_features=None,
            block_hasher=get_request_block_hasher(BLOCK_SIZE, self.hash_fn),
        )
        req.kv_transfer_params = params
        self.scheduler.add_request(req)

    # -- one engine step ----------------------------------------------------------------

    def step(self):
        """EngineCore.step: schedule, execute (the worker), update_from_output."""
        from vllm.forward_context import set_forward_context
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.worker.kv_connector_model_runner_mixin import (
            KVConnectorModelRunnerMixin as Mixin,
        )

        sched_out = self.scheduler.schedule()
        self.stats["steps"] += 1
        meta = sched_out.kv_connector_metadata
        if getattr(meta, "heartbeat_by_engine", None):
            # The decode's scheduler asks its worker to send "HB:<ids>" NIXL notifs.
            self.stats["heartbeat_rounds"] = self.stats.get("heartbeat_rounds", 0) + 1
        for rid, req_meta in getattr(meta, "reqs_to_recv", {}).items():
            if req_meta.local_block_ids:
                self.recv_blocks[rid] = list(req_meta.local_block_ids[0])
        if sched_out.total_num_scheduled_tokens == 0:
            out = Mixin.kv_connector_no_forward(sched_out, self.vllm_config)
            kv_out = out.kv_connector_output
        else:
            with (
                set_forward_context(None, self.vllm_config),
                Mixin.maybe_get_kv_connector_output(sched_out) as kv_out,
            ):
                req_ids, sampled = self.forward(sched_out)
                if self.step_delay:
                    time.sleep(self.step_delay)  # a slow model: requests wait on this side
            out = ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=None,
                kv_connector_output=kv_out,
            )
        now = time.perf_counter()
        if kv_out is not None:
            for rid in kv_out.finished_recving or ():
                self.verify(rid)
            for rid in kv_out.finished_sending or ():
                # How long the prefill held the blocks after the request finished: past
                # kv_lease_duration only the decode's heartbeats keep them.
                held = now - self.finished_at.pop(rid, now)
                self.stats["max_block_hold_s"] = max(self.stats.get("max_block_hold_s", 0), held)
            if kv_out.kv_connector_stats is not None:
                data = kv_out.kv_connector_stats.data or {}
                for key, value in data.items():
                    if key in ("transfer_duration", "post_duration"):
                        key, value = key.replace("duration", "s"), sum(value)
                    elif isinstance(value, list):
                        value = sum(value)
                    if isinstance(value, (int, float)):
                        self.kv_stats[key] = self.kv_stats.get(key, 0) + value
                n = len(data.get("transfer_duration", ()))
                self.kv_stats["transfers"] = self.kv_stats.get("transfers", 0) + n
        outputs = self.scheduler.update_from_output(sched_out, out)
        finished = []
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append((o.request_id, o.kv_transfer_params))
                    self.finished_at[o.request_id] = now
        return finished

    def forward(self, sched_out):
        """The model: on the prefill, write the pattern into every page of every block
        computed so far; sample SAMPLED_TOKEN once the prompt is done."""
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import (
            get_base_request_id,
        )

        req_ids = [r.req_id for r in sched_out.scheduled_new_reqs]
        req_ids += list(sched_out.scheduled_cached_reqs.req_ids)
        sampled = []
        for rid in req_ids:
            req = self.scheduler.requests[rid]
            if self.role == "prefill":
                blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
                done = self.written.setdefault(rid, set())
                base = get_base_request_id(rid)
                upto = -(-req.num_computed_tokens // BLOCK_SIZE)
                for j in range(min(upto, len(blocks))):
                    if j not in done:
                        for layer in range(LAYERS):
                            self.page_of(blocks[j], layer).copy_(self.expected(base, j, layer))
                        done.add(j)
            sampled.append([SAMPLED_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
        return req_ids, sampled

    def verify(self, rid: str):
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import (
            get_base_request_id,
        )

        blocks = self.recv_blocks.pop(rid, None)
        if not blocks:
            self.stats["missing"] = self.stats.get("missing", 0) + 1
            return
        base = get_base_request_id(rid)
        for j, block in enumerate(blocks):
            for layer in range(LAYERS):
                if self.torch.equal(self.page_of(block, layer), self.expected(base, j, layer)):
                    self.stats["bytes_checked"] += self.page
                    self.stats["blocks_checked"] += 1
                else:
                    self.stats["bad_blocks"] += 1
        self.stats["verified"] = self.stats.get("verified", 0) + 1

    def shutdown(self):
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

        try:
            ensure_kv_transfer_shutdown()
            self.scheduler.shutdown()
        finally:
            try:
                os.unlink(self._dist_file)
            except OSError:
                pass


def child_main(role, mode, conn, num_blocks, model_dir, lease, step_delay, layout):
    """Runs in a spawned process: set up, then serve the parent's messages and step."""
    # Logs (vLLM's, NIXL's, UCX's, from C too) go to stderr: stdout is for the JSON lines.
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        # spawn gives the child the parent's sys.path: put the nixl shim (PYTHONPATH) back.
        for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        inst = Instance(role, mode, num_blocks, model_dir, lease, step_delay, layout)
        import nixl

        conn.send(("ready", getattr(nixl, "__file__", None)))
        stop = False
        t_first = None
        while not stop:
            busy = inst.scheduler.has_requests()
            if conn.poll(0 if busy else 0.05):
                while conn.poll(0):
                    msg = conn.recv()
                    if msg[0] == "stop":
                        stop = True
                    elif msg[0] == "add":
                        for rid, prompt, max_tokens, params in msg[1]:
                            inst.add_request(rid, prompt, max_tokens, params)
                        if t_first is None:
                            t_first = time.perf_counter()
                    elif msg[0] == "sleep_wake":
                        inst.sleep_and_wake()
                        conn.send(("awake",))
                    elif msg[0] == "reset":
                        inst.stats.update(
                            bytes_checked=0, blocks_checked=0, bad_blocks=0, verified=0,
                            heartbeat_rounds=0, steps=0, max_block_hold_s=0,
                        )
                        inst.kv_stats.clear()
                continue
            if not busy:
                continue
            finished = inst.step()
            if finished:
                conn.send(("finished", finished))
            if not inst.scheduler.has_requests():
                # The pull worker's record of the prefill's registrations (1 after a sleep).
                gens = getattr(inst.connector.connector_worker, "_remote_registration_generations", {})
                inst.stats["registration_generation"] = max(gens.values(), default=0)
                conn.send(("idle", inst.stats, inst.kv_stats))
        conn.send(("stats", inst.stats, inst.kv_stats))
        inst.shutdown()
        conn.send(("bye",))
        conn.close()
        # Leave without the interpreter's exit handlers: NIXL 1.5.1's UCX segfaults in a
        # library destructor at exit (rtnl_tc_unregister in libnl), after all the work.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException:  # noqa: BLE001 (reported to the parent)
        conn.send(("error", traceback.format_exc()))
        raise


# --------------------------------------------------------------------------------------
# The parent: vLLM's disaggregation proxy between the two.
# --------------------------------------------------------------------------------------


# --mode heartbeat: a slow decode (0.3 s a step, 20 tokens a request, room for few requests)
# makes prefilled requests wait on it for longer than a 3 s lease; the decode's scheduler sends
# "HB:" notifications every step, each extending the prefill's lease by 2 s. Right when no
# request expired on the prefill, every byte arrived, and some block was held past the lease.
HEARTBEAT = {"lease": 3, "decode_step_delay": 0.3, "decode_tokens": 20, "inflight": 2}


def run_pair(package, mode, args, model_dir, shim_dir):
    import copy
    import multiprocessing as mp
    import random
    from multiprocessing.connection import wait

    if mode == "heartbeat":
        args = copy.copy(args)
        vars(args).update(HEARTBEAT, requests=min(args.requests, 16))

    env_keep = dict(os.environ)
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.pop("HMC_ALIAS", None)
    if package == "hmc":
        os.environ["HMC_ALIAS"] = "nixl"
    else:
        os.environ["PYTHONPATH"] = shim_dir + (
            os.pathsep + env_keep["PYTHONPATH"] if env_keep.get("PYTHONPATH") else ""
        )

    blocks_per_req = -(-args.prompt_tokens // BLOCK_SIZE) + 1
    # Room for --inflight requests; more wait in the schedulers' queues for free blocks.
    num_blocks = max(min(args.requests, args.inflight), args.warmup) * blocks_per_req + 64
    ctx = mp.get_context("spawn")
    procs, conns = {}, {}
    try:
        for role in ("prefill", "decode"):
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=child_main,
                args=(
                    role, mode, child, num_blocks, model_dir, args.lease,
                    args.decode_step_delay if role == "decode" else 0.0,
                    args.layout,
                ),
                name=f"vllm-{role}",
            )
            p.start()
            procs[role], conns[role] = p, parent
    finally:
        os.environ.clear()
        os.environ.update(env_keep)
    P, D = conns["prefill"], conns["decode"]
    deadline = time.monotonic() + args.timeout

    def recv(conn, what):
        while True:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{what}: no answer within {args.timeout} s")
            msg = conn.recv()
            if msg[0] == "error":
                raise RuntimeError(f"{what}:\n{msg[1]}")
            return msg

    result = None
    try:
        where = {}
        for role, conn in conns.items():
            where[role] = recv(conn, f"{role} start-up")[1]
        rng = random.Random(56)

        def batch(tag, n):
            reqs = []
            for i in range(n):
                prompt = [rng.randrange(3, 32000) for _ in range(args.prompt_tokens)]
                rid = f"{tag}{i}-{rng.getrandbits(32):08x}"
                reqs.append((rid, prompt, 1, {"do_remote_decode": True}))
            return reqs

        def run(reqs):
            """Prefill them all, hand each finished prefill to the decode, wait until the
            decode finished them all and both sides are idle."""
            prompts = {rid: prompt for rid, prompt, _, _ in reqs}
            t0 = time.perf_counter()
            P.send(("add", reqs))
            decoded = set()
            p_idle = d_idle = False
            p_stats = d_stats = None
            while len(decoded) < len(reqs) or not (p_idle and d_idle):
                ready = wait([P, D], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise TimeoutError(
                        f"{len(decoded)}/{len(reqs)} decoded within {args.timeout} s"
                    )
                for conn in ready:
                    msg = conn.recv()
                    if msg[0] == "error":
                        raise RuntimeError(msg[1])
                    if conn is P and msg[0] == "finished":
                        p_idle = False
                        to_d = []
                        for rid, params in msg[1]:
                            assert params, f"prefill of {rid} returned no kv_transfer_params"
                            base = rid.rsplit("-", 1)[0]
                            d_rid = f"{base}-{rng.getrandbits(32):08x}"
                            to_d.append((d_rid, prompts[rid], args.decode_tokens, params))
                        D.send(("add", to_d))
                        d_idle = False
                    elif conn is D and msg[0] == "finished":
                        decoded.update(rid for rid, _ in msg[1])
                    elif msg[0] == "idle":
                        if conn is P:
                            p_idle, p_stats = True, msg[1:]
                        else:
                            d_idle, d_stats = True, msg[1:]
            return time.perf_counter() - t0, p_stats, d_stats

        if args.warmup or mode == "sleep":
            run(batch("warm", max(1, args.warmup)))
        if mode == "sleep":
            P.send(("sleep_wake",))
            recv(P, "prefill sleep and wake-up")
        D.send(("reset",))
        P.send(("reset",))
        seconds, p_stats, d_stats = run(batch("req", args.requests))
        stats, kv_stats = d_stats
        expect_blocks = args.requests * (-(-args.prompt_tokens // BLOCK_SIZE)) * LAYERS
        ok = (
            stats["bad_blocks"] == 0
            and stats.get("missing", 0) == 0
            and stats.get("verified", 0) == args.requests
            and stats["blocks_checked"] == expect_blocks
        )
        expired = p_stats[1].get("num_kv_expired_reqs", 0) + kv_stats.get("num_kv_expired_reqs", 0)
        held = p_stats[0].get("max_block_hold_s", 0)
        if mode == "heartbeat":
            ok = ok and expired == 0 and held > args.lease
        result = {
            "system": "hmc.nixl" if package == "hmc" else "nixl",
            "mode": mode,
            "requests": args.requests,
            "bytes_ok": ok,
            "bytes_checked": stats["bytes_checked"],
            "blocks_checked": stats["blocks_checked"],
            "bad_blocks": stats["bad_blocks"],
            "requests_per_s": round(args.requests / seconds, 2),
            "seconds": round(seconds, 3),
            "prompt_tokens": args.prompt_tokens,
            "kv_bytes_per_request": -(-args.prompt_tokens // BLOCK_SIZE) * LAYERS * (
                2 * BLOCK_SIZE * KV_HEADS * HEAD_SIZE * 2
            ),
            "heartbeat_rounds": stats.get("heartbeat_rounds", 0),
            "registration_generation": None if mode == "push" else stats.get("registration_generation", 0),
            "prefill_max_block_hold_s": round(p_stats[0].get("max_block_hold_s", 0), 2),
            "lease_s": args.lease,
            "expired_requests": expired,
            "decode_steps": stats["steps"],
            "decode_connector_stats": kv_stats,
            "prefill_connector_stats": p_stats[1],
            "nixl_module": where["decode"],
        }
    finally:
        for conn in conns.values():
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for role, p in procs.items():
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(5)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="hmc", help="hmc, nixl or hmc,nixl")
    ap.add_argument(
        "--mode",
        default="all",
        choices=["pull", "push", "sleep", "heartbeat", "all"],
        help="sleep: pull, with the prefill put to sleep and woken after the warm-up; "
        "heartbeat: pull, with requests waiting on a slow decode longer than the lease",
    )
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--inflight", type=int, default=48, help="requests whose KV fits at once")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=500)
    ap.add_argument("--decode-tokens", type=int, default=2)
    ap.add_argument("--lease", type=int, default=6, help="kv_lease_duration (s); heartbeats every lease//6 s")
    ap.add_argument(
        "--decode-step-delay",
        type=float,
        default=0.0,
        help="seconds each decode model step takes: with --inflight small, prefilled requests "
        "wait on the decode longer than the lease, and only the heartbeats keep their blocks",
    )
    ap.add_argument(
        "--layout",
        default="LBHNC",
        choices=["LBHNC", "BLHNC"],
        help="the KV cache layout: LBHNC (what the connector asks for: layer-outermost) or "
        "BLHNC (block-outermost: a block's layers side by side)",
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()

    packages = [p.strip() for p in args.package.split(",") if p.strip()]
    for p in packages:
        if p not in ("hmc", "nixl"):
            ap.error(f"unknown package {p!r}")
    modes = ["pull", "push", "sleep", "heartbeat"] if args.mode == "all" else [args.mode]

    work = tempfile.mkdtemp(prefix="vllm-nixl-compat-")
    model_dir = os.path.join(work, "model")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
    shim_dir = os.path.join(work, "nixl-shim")
    os.makedirs(os.path.join(shim_dir, "nixl"))
    with open(os.path.join(shim_dir, "nixl", "__init__.py"), "w") as f:
        f.write(NIXL_SHIM)

    failed = False
    results = []
    for mode in modes:
        for package in packages:
            try:
                r = run_pair(package, mode, args, model_dir, shim_dir)
            except Exception as e:  # noqa: BLE001 (one failed run is a result)
                r = {
                    "system": "hmc.nixl" if package == "hmc" else "nixl",
                    "mode": mode,
                    "requests": args.requests,
                    "bytes_ok": False,
                    "requests_per_s": None,
                    "error": f"{type(e).__name__}: {e}"[-4000:],
                }
            results.append(r)
            failed |= not r["bytes_ok"]
            print(json.dumps(r), flush=True)
    if len(packages) > 1:
        print(f"{'mode':6} " + " ".join(f"{p:>14}" for p in packages) + "  (requests/s)", file=sys.stderr)
        for mode in modes:
            row = [r for r in results if r["mode"] == mode]
            print(f"{mode:6} " + " ".join(f"{str(r['requests_per_s']):>14}" for r in row), file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
