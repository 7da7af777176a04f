#!/usr/bin/env bash
# GPU check for hmc-backend-cuda, for a machine with an NVIDIA GPU (run from the repository
# root): the CUDA tests (memory conformance kit, async copies, IPC between two processes,
# DMA-BUF export), the copy bandwidth beside a plain cuMemcpy loop, and the device-staged
# RPC echo and one-sided WRITE/READ between two processes beside the same operations on
# host memory (hmc-rpc's device_staged example). Output goes to ${OUT:-.}/cuda-check.txt;
# the tables are markdown for docs/benchmarks.md. This script needs cargo; for a GPU machine
# without a Rust toolchain (the lent ones), `cargo xtask gpu-bundle` builds the same steps
# as binaries with target/gpu-bundle/run.sh.
set -euo pipefail
out="${OUT:-.}/cuda-check.txt"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  cargo test -p hmc-backend-cuda -- --test-threads=1 2>&1
  cargo run --release -p hmc-backend-cuda --example cuda_bandwidth -- 256 20 2>&1
  cargo run --release -p hmc-rpc --example device_staged -- --memory cuda --mib 64 --iters 5 2>&1
  # The KV pattern on VRAM beside cuMemcpy and NIXL: needs hmc installed in the python3
  # here (pip install hmc-py/, or the wheel of cargo xtask gpu-bundle) and, for NIXL's
  # row, nixl-cu12==1.5.1 (--no-deps, with numpy).
  python3 hmc-py/bench/bench_kv_vram.py --rounds 5 --seconds 1 2>&1
} | tee "$out"
