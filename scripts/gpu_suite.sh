#!/usr/bin/env bash
# Everything the GPU fast path must show, from one call on the device machine (see
# docs/benchmarks.md). Usage: bash scripts/gpu_suite.sh [tests] [decode] [prefill] [timeline] [profile]
# (default all but profile); results in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" ${*:-all} "
bench() { python3 -m hotpath.cli bench latency "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"

if [[ $what == *" tests "* || $what == *" all "* ]]; then
  python3 -m pytest -q -p no:cacheprovider -n 8 tests/ops 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
  # one at a time: each default engine takes 90% of the GPU
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -15
fi
if [[ $what == *" decode "* || $what == *" all "* ]]; then
  bench --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256 --compare hf --json "$OUT/qwen3-8b_bs1.json"
  bench --preset qwen3-0.6b --batch-size 1 --input-len 512 --output-len 256 --json "$OUT/qwen3-0.6b_bs1.json"
  bench --preset qwen3-8b --batch-size 64 --input-len 1024 --output-len 64 --json "$OUT/qwen3-8b_bs64.json"
  # the host's share: the batch-1 lines again with the engine's host work not overlapped
  bench --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256 --no-async-scheduling --json "$OUT/qwen3-8b_bs1_sync.json"
  bench --preset qwen3-0.6b --batch-size 1 --input-len 512 --output-len 256 --no-async-scheduling --json "$OUT/qwen3-0.6b_bs1_sync.json"
fi
if [[ $what == *" prefill "* || $what == *" all "* ]]; then
  bench --preset qwen3-8b --batch-size 1 --input-len 8192 --output-len 8 --json "$OUT/qwen3-8b_prefill8k.json"
  bench --preset qwen3-8b --batch-size 1 --input-len 32768 --output-len 8 --json "$OUT/qwen3-8b_prefill32k.json"
fi
if [[ $what == *" timeline "* || $what == *" all "* ]]; then
  # what each kernel of the batch-1 decode graph adds to the step, and the kernels' registers
  python3 benchmarks/decode_timeline.py --preset qwen3-0.6b --out "$OUT" | tail -12
  python3 benchmarks/decode_timeline.py --preset qwen3-8b --out "$OUT" | tail -12
  python3 benchmarks/kernel_registers.py | tee "$OUT/kernel_registers.json"
  # attention's cost in the step: the graph without it, and with a kernel that only waits
  python3 benchmarks/decode_variants.py --preset qwen3-0.6b --variants full,none,copy --out "$OUT" | tail -3
  python3 benchmarks/decode_variants.py --preset qwen3-8b --variants full,none,copy --out "$OUT" | tail -3
fi
if [[ $what == *" profile "* ]]; then
  python3 benchmarks/profile_decode.py --preset qwen3-0.6b --out "$OUT" | tail -30
  python3 benchmarks/profile_decode.py --preset qwen3-8b --out "$OUT" | head -3
  # what a step pays beyond its graph's replay: the input copy, the engine's loop, the launch
  python3 benchmarks/graph_replay_costs.py --preset qwen3-0.6b --out "$OUT" | tail -2
fi
