#!/usr/bin/env bash
# The checks that need a GPU, in one run for a lent machine (the `device` tool: its image's python3 holds
# a CUDA torch, pytest and hypothesis; nothing can be installed there, so our packages go on PYTHONPATH).
#
#   bash bench/gpu_check.sh            # writes under $OUT (or ./gpu-check), about 3-5 minutes on an H100/H200
#
# 1. Every test that a GPU unskips (real streams, pinned memory, the pool on a device, overlapped steps).
# 2. bench/offload/upload_priority.py: an activation copy's latency behind a weight upload, paced vs at once.
# 3. bench/offload/async_overlap.py on two pool "devices" of the one GPU: the asynchronous optimizer's overlap.
# 4. bench/offload/store_adds.py: how long a STORE holds its worker, adds on it against queued for the store's thread.
# Copy the files it writes into bench/results/ (gpu_check.md) with the card named; CI never runs this.
set -u
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT/packages/schedules/src:$ROOT/packages/partition/src:$ROOT/packages/offload/src:$ROOT/packages/runtime/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1
PY="${PYTHON:-python3}"
{
  echo "# GPU checks (MEASURED)"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" 2>&1
  echo '```'
  echo
  echo "## 1. Tests a GPU unskips"
  echo
  echo '```'
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib -ra" \
    packages/offload/tests/test_offload_cuda.py packages/offload/tests/test_offload_transfers.py \
    packages/offload/tests/test_offload_host_store.py packages/offload/tests/test_offload_weight_uploads.py \
    packages/runtime/tests/test_rt_pool.py packages/runtime/tests/test_rt_pool_async.py \
    packages/runtime/tests/test_rt_pool_overlap.py packages/runtime/tests/test_rt_pool_memory_boundaries.py \
    packages/runtime/tests/test_rt_pool_host_buffers.py packages/runtime/tests/test_rt_pool_weight_uploads.py \
    packages/offload/tests/test_offload_grad_adds.py packages/runtime/tests/test_rt_pool_grad_adds.py 2>&1 | tail -40
  echo '```'
  echo
  echo "## 2. Activation uploads behind weight uploads"
  echo
  timeout 120 "$PY" bench/offload/upload_priority.py 2>&1 | tail -12
  echo
  echo "## 3. Asynchronous optimizer overlap on a GPU pool (two pool devices on cuda:0)"
  echo
  echo '```'
  timeout 180 "$PY" bench/offload/async_overlap.py --devices cuda:0,cuda:0 --width 2048 --layers 12 2>&1 | tail -20
  echo '```'
  echo
  echo "## 4. A STORE's hold on its worker: adds on it vs queued"
  echo
  timeout 120 "$PY" bench/offload/store_adds.py 2>&1 | tail -8
} > "$OUT/gpu_check.md"
cat "$OUT/gpu_check.md"
