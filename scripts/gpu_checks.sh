#!/usr/bin/env bash
# Issue 18's GPU checks, one device call: the kernel tests (offsets past 2**31 included), the engine
# under compute-sanitizer, the kernel tests under compute-sanitizer, and the default-engine tests.
# Usage: bash scripts/gpu_checks.sh [ops] [sanitize-engine] [sanitize-kernels] [default] [soak] [latency]
# (default: ops sanitize-engine sanitize-kernels default).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" ${*:-ops sanitize-engine sanitize-kernels default} "
san="/usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20"
if [[ $what == *" ops "* ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 tests/ops 2>&1 | tee "$OUT/pytest_ops.log" | tail -8
fi
if [[ $what == *" sanitize-engine "* ]]; then
  # the engine as a user starts it (default max_model_len 40960, caching allocator, CUDA graphs)
  timeout 300 $san python3 scripts/crash_repro.py qwen3-0.6b '{"max_num_seqs": 4}' > "$OUT/sanitizer_engine.log" 2>&1
  echo "sanitizer, engine start + generate: exit $?"; grep -E "ERROR SUMMARY|Invalid|ok" "$OUT/sanitizer_engine.log" | head -5
fi
if [[ $what == *" sanitize-kernels "* ]]; then
  # kernels on their own allocations (no caching allocator: every tensor's bounds are exact)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 $san python3 -m pytest -q -p no:cacheprovider -x \
    tests/ops/test_large_offsets.py tests/ops/test_attention.py tests/ops/test_rotary.py tests/ops/test_linear.py \
    tests/ops/test_sampling.py tests/ops/test_norm.py tests/ops/test_embedding.py -k "not graph and not interpreter" \
    > "$OUT/sanitizer_kernels.log" 2>&1
  echo "sanitizer, kernel tests: exit $?"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$OUT/sanitizer_kernels.log" | tail -4
fi
if [[ $what == *" default "* ]]; then
  timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_default_path.py -k "0.6b or longest" 2>&1 \
    | tee "$OUT/pytest_default.log" | tail -6
fi
if [[ $what == *" soak "* ]]; then
  HOTPATH_SOAK_OUT=$OUT/soak.json timeout 300 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_soak.py 2>&1 \
    | tee "$OUT/pytest_soak.log" | tail -6
fi
if [[ $what == *" latency "* ]]; then
  for p in qwen3-8b qwen3-0.6b; do
    timeout 200 python3 -m hotpath.cli bench latency --preset $p --batch-size 1 --input-len 512 --output-len 256 \
      --json "$OUT/latency_${p}_bs1_defaults.json" 2>&1 | grep -E "TPOT|max_model_len|TTFT"
  done
fi
