#!/usr/bin/env bash
# Issue 20's GPU checks and figures (Qwen3.5 / Qwen3-Next hybrids), for one or two device calls:
#   tests    the gated-delta kernels and the hybrid models on the GPU
#   fla      fla-core (a wheel carried in .whl/) installed, then the prefill kernels side by side
#            (benchmarks/bench_gated_delta_prefill.py)
#   latency  hotpath bench latency at every engine default, random weights at the published shapes:
#            qwen3.5-9b batch 1 (with HF transformers on the same shape), 8 and 64, qwen3.5-35b-a3b
#            batch 1, 8 and 64, qwen3.5-27b batch 1 (qwen3-next-80b-a3b's 160 GB of bf16 do not fit
#            one H200)
#   long     TTFT of 8K, 32K and 128K-token prompts on qwen3.5-35b-a3b (and the TPOT after them), and
#            where a 32K prefill's GPU time goes (benchmarks/profile_prefill.py)
#   chat     a two-turn chat through hotpath serve on qwen3.5-35b-a3b (scripts/two_turn_chat.py;
#            the server's wheels and the Qwen3 tokenizer from .whl/)
# Usage: bash scripts/gpu_hybrid.sh [tests] [fla] [latency] [long] [chat]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" $* "
bench="python3 -m hotpath.cli bench latency"
if [[ $what == *" fla "* ]]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/fla .whl/einops-*.whl .whl/fla_core-*.whl 2>&1 \
    | grep -v WARNING | tail -2
  export PYTHONPATH=$PYTHONPATH:/tmp/fla
fi
if [[ $what == *" tests "* ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_gated_delta*.py \
    tests/ops/test_model_cuda.py ${HYBRID_TESTS:-} 2>&1 | tee "$OUT/pytest_hybrid.log" | tail -8
fi
if [[ $what == *" fla "* ]]; then
  timeout 200 python3 benchmarks/bench_gated_delta_prefill.py 2>&1 | tee "$OUT/prefill_kernels.log" | tail -30
fi
if [[ $what == *" latency "* ]]; then
  timeout 200 $bench --preset qwen3.5-9b --batch-size 1 8 64 --input-len 512 --output-len 64 \
    ${HYBRID_COMPARE:---compare hf} --json "$OUT/latency_qwen3.5-9b.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
  timeout 200 $bench --preset qwen3.5-35b-a3b --batch-size 1 8 64 --input-len 512 --output-len 64 \
    --json "$OUT/latency_qwen3.5-35b-a3b.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
  timeout 150 $bench --preset qwen3.5-27b --batch-size 1 --input-len 512 --output-len 64 \
    --json "$OUT/latency_qwen3.5-27b.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
fi
if [[ $what == *" long "* ]]; then
  for n in 8192 32768 131072; do
    timeout 200 $bench --preset qwen3.5-35b-a3b --batch-size 1 --input-len $n --output-len 16 \
      --json "$OUT/latency_qwen3.5-35b-a3b_${n}.json" 2>&1 | grep -E "TTFT|TPOT|matmul"
  done
  timeout 150 python3 benchmarks/profile_prefill.py --preset qwen3.5-35b-a3b --input-len 32768 --out "$OUT" \
    2>&1 | tail -22
fi
if [[ $what == *" chat "* ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
  PYTHONPATH=$PWD:/tmp/site timeout 400 python3 scripts/two_turn_chat.py --preset qwen3.5-35b-a3b --out "$OUT" \
    2>&1 | tail -4
fi
