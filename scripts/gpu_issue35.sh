#!/usr/bin/env bash
# Issue 35 on a GPU (carry: [".whl"]: gguf, llguidance, ...), each part under its own limit:
#   1. the int4 kernels' and the AWQ model's GPU tests, the GGUF kernel's and the tiny GGUF model's
#   2. benchmarks/bench_quant_gemv.py: bf16 / fp8 / int4 at 1-64 rows, Qwen3-8B and 32B shapes
#   3. benchmarks/gguf_decode.py kernels: the default model's GGUF layers against bf16, 1-64 rows
#   4. Qwen2.5-Coder-32B AWQ through `hotpath bench latency` at batch 1 and 32
#   5. Nsight Compute on the int4 GEMV at one row (32B shapes)
#   6. the default model's GGUF layout (random blocks) kept quantized against its 16-bit copy through
#      `hotpath bench latency` at batch 1, 8 and 32
#   7. Qwen3-8B bf16 / fp8 block / fp8 PTPC at batch 1 and 32
#   8. Qwen3-8B at batch 32 with 8K contexts, bf16 against fp8 KV; Qwen3-30B-A3B bf16 / fp8 block
# Usage: bash scripts/gpu_issue35.sh [PARTS...]   (default: 1 2 3 4; then 5 6 7, then 8; a call is 600 s)
set -uo pipefail
export PYTHONUNBUFFERED=1 HOTPATH_CACHE=/tmp/hotpath-cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
parts=" ${*:-1 2 3 4} "
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
if [[ $parts == *" 1 "* ]]; then
  # -n 0: the device's pytest-xdist stopped with an INTERNALERROR under the repo's conftest
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 -rf --tb=short tests/ops/test_quant_int4.py \
    tests/layers/test_quant_loaders.py tests/ops/test_gguf_kernel.py tests/loader/test_gguf_quantized.py \
    -k cuda 2>&1 | tee "$OUT/pytest_issue35.log" | tail -12
fi
if [[ $parts == *" 2 "* ]]; then
  timeout 170 python3 benchmarks/bench_quant_gemv.py --out "$OUT" 2>&1 | tee "$OUT/bench_quant_gemv.log" | tail -165
fi
if [[ $parts == *" 3 "* ]]; then
  timeout 60 python3 benchmarks/gguf_decode.py kernels benchmarks/gguf_layouts/qwen2.5-coder-0.5b-instruct-q4_k_m.json \
    ${SWEEP:+--sweep} --json "$OUT/gguf_kernels_0.5b.json" 2>&1 | tail -60
fi
if [[ $parts == *" 4 "* ]]; then
  timeout 150 python3 -m hotpath.cli bench latency --preset qwen2.5-coder-32b-awq --batch-size 1 32 --input-len 512 \
    --output-len 64 --json "$OUT/latency_qwen2.5-coder-32b-awq.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
fi
if [[ $parts == *" 5 "* ]]; then
  timeout 60 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section InstructionStats -k "regex:int4_gemv" --launch-skip 0 \
    python3 benchmarks/bench_quant_gemv.py --once --rows 1 --models qwen2.5-coder-32b --out /tmp/ncu-scratch \
    > "$OUT/ncu_int4.txt" 2>&1
  grep -E "^  _|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Stall" \
    "$OUT/ncu_int4.txt" | head -60
fi
if [[ $parts == *" 6 "* ]]; then
  LAYOUTS=qwen2.5-coder-0.5b-instruct-q4_k_m OUT=$OUT bash scripts/gpu_gguf.sh models
fi
if [[ $parts == *" 7 "* ]]; then
  for p in qwen3-8b qwen3-8b-fp8 qwen3-8b-fp8-ptpc; do
    timeout 110 python3 -m hotpath.cli bench latency --preset $p --batch-size 1 32 --input-len 512 --output-len 64 \
      --json "$OUT/latency_$p.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
  done
fi
if [[ $parts == *" 8 "* ]]; then
  OUT=$OUT timeout 330 bash scripts/gpu_quant.sh kv
  for p in qwen3-30b-a3b qwen3-30b-a3b-fp8; do
    timeout 120 python3 -m hotpath.cli bench latency --preset $p --batch-size 1 32 --input-len 512 --output-len 64 \
      --json "$OUT/latency_$p.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
  done
fi
