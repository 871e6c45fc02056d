#!/usr/bin/env bash
# Issue 21's GPU checks and figures (quantization), for a few device calls:
#   tests    the quantized kernels, the fp8 KV cache paths and the prefill conv on the GPU
#   int4     the int4 kernels' and the AWQ model's GPU tests only
#   gemv     benchmarks/bench_quant_gemv.py: each format's kernels at Qwen3-8B's and
#            Qwen2.5-Coder-32B's projection shapes, 1 / 4 / 16 / 32 / 64 rows, against bf16
#   ncu      Nsight Compute's speed-of-light, occupancy and warp-state sections of each format's
#            kernels at one row (NCU_ROWS) at both models' shapes
#   dense    hotpath bench latency at every engine default, random weights: Qwen3-8B bf16, fp8 block
#            and fp8 PTPC at batch 1 and 32, and their 8K-token prefill
#   awq      Qwen2.5-Coder-32B AWQ int4 at batch 1 and 32 (and its float16 original at batch 1)
#   moe      Qwen3-30B-A3B bf16, fp8 block, fp8 PTPC, AWQ, GPTQ at batch 1 and 32
#   kv       Qwen3-8B at batch 32 with 8K contexts, bf16 KV against fp8 KV
#   serve    Qwen2.5-Coder-32B AWQ through `hotpath serve`: ShareGPT prompts, 32 at a time (needs
#            .whl/ and .gpu_assets/ carried, see scripts/gpu_serve_sharegpt.sh)
# Usage: bash scripts/gpu_quant.sh [tests] [int4] [gemv] [ncu] [dense] [awq] [moe] [kv] [serve]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" $* "
bench="python3 -m hotpath.cli bench latency"
quiet() { grep -vE "^\[bench\]|Loading|it/s"; }
if [[ $what == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 -rf --tb=short tests/ops/test_quant.py \
    tests/ops/test_quant_int4.py tests/ops/test_moe.py tests/ops/test_moe_int4.py \
    tests/ops/test_moe_fp8_model.py tests/ops/test_moe_int4_model.py \
    tests/ops/test_attention.py tests/ops/test_rotary.py tests/engine/test_kv_cache_fp8.py \
    ${QUANT_TESTS:-} -k "${QUANT_K:-cuda}" 2>&1 \
    | tee "$OUT/pytest_quant.log" | tail -40
fi
if [[ $what == *" int4 "* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 -rf --tb=short tests/ops/test_quant_int4.py \
    tests/layers/test_quant_loaders.py -k cuda 2>&1 | tee "$OUT/pytest_int4.log" | tail -20
fi
if [[ $what == *" gemv "* ]]; then
  timeout 300 python3 benchmarks/bench_quant_gemv.py --out "$OUT" 2>&1 | tee "$OUT/bench_quant_gemv.log" | tail -170
fi
if [[ $what == *" ncu "* ]]; then
  timeout 240 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats -k "regex:gemv|int4|fp8|gemm" \
    python3 benchmarks/bench_quant_gemv.py --once --rows ${NCU_ROWS:-1} --out /tmp/ncu-scratch \
    > "$OUT/ncu_quant.txt" 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots|Stall|cycles being stalled" \
    "$OUT/ncu_quant.txt" | head -150
fi
if [[ $what == *" dense "* ]]; then
  for p in ${DENSE_PRESETS:-qwen3-8b qwen3-8b-fp8 qwen3-8b-fp8-ptpc}; do
    timeout 150 $bench --preset $p --batch-size 1 32 --input-len 512 --output-len 64 \
      --json "$OUT/latency_$p.json" 2>&1 | quiet
    timeout 100 $bench --preset $p --batch-size 1 --input-len 8192 --output-len 8 \
      --json "$OUT/latency_${p}_8192.json" 2>&1 | grep -E "model|TTFT"
  done
fi
if [[ $what == *" awq "* ]]; then
  timeout 200 $bench --preset qwen2.5-coder-32b-awq --batch-size 1 32 --input-len 512 --output-len 64 \
    --json "$OUT/latency_qwen2.5-coder-32b-awq.json" 2>&1 | quiet
fi
if [[ $what == *" moe "* ]]; then
  for p in ${MOE_PRESETS:-qwen3-30b-a3b qwen3-30b-a3b-fp8 qwen3-30b-a3b-fp8-ptpc qwen3-30b-a3b-awq qwen3-30b-a3b-gptq}; do
    timeout 150 $bench --preset $p --batch-size 1 32 --input-len 512 --output-len 64 \
      --json "$OUT/latency_$p.json" 2>&1 | quiet
  done
fi
if [[ $what == *" kv "* ]]; then
  for kv in auto fp8; do
    timeout 200 $bench --preset qwen3-8b --kv-cache-dtype $kv --batch-size 32 --input-len 8192 \
      --output-len 32 --json "$OUT/latency_qwen3-8b_kv-$kv.json" 2>&1 | quiet
  done
fi
if [[ $what == *" serve "* ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site HOTPATH_CACHE=/tmp/hotpath-cache
  mkdir -p $HOTPATH_CACHE/datasets/sharegpt
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    .gpu_assets/sharegpt.json.xz $HOTPATH_CACHE/datasets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
  model=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen2.5-coder-32b-awq'))")
  python3 -m hotpath.cli serve --model "$model" --load-format dummy --tokenizer .whl/qwen3-tokenizer \
    --port 8000 > "$OUT/server_awq.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
  python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 --dataset sharegpt --num-prompts 96 \
    --output-len 256 --max-concurrency 32 --num-warmup 8 --no-progress \
    --output-json "$OUT/serve_awq_sharegpt.json" --label "H200, Qwen2.5-Coder-32B AWQ shape, 32 streams" 2>&1 | tail -14
  kill -TERM $server; wait $server; echo "server exit code $?"
fi
