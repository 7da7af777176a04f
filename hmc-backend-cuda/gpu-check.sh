#!/usr/bin/env bash
# GPU check for hmc-backend-cuda, for a machine with an NVIDIA GPU (run from the repository
# root): the CUDA tests (memory conformance kit, async copies, IPC between two processes,
# DMA-BUF export) and the copy bandwidth beside a plain cuMemcpy loop. Output goes to
# ${OUT:-.}/cuda-check.txt; the bandwidth table is markdown for docs/benchmarks.md.
set -euo pipefail
out="${OUT:-.}/cuda-check.txt"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  cargo test -p hmc-backend-cuda -- --test-threads=1 2>&1
  cargo run --release -p hmc-backend-cuda --example cuda_bandwidth -- 256 20 2>&1
} | tee "$out"
