#!/usr/bin/env bash
# Issue 19's GPU checks and figures, for one or two device calls:
#   tests    the MoE kernels and the models on the GPU (tests/ops/test_moe.py, test_model_cuda.py)
#   tune     benchmarks/tune_moe.py --quick for Qwen3-30B-A3B's shapes, into hotpath/ops/moe/configs
#            (used by what follows in the call) and packed into $OUT/moe_configs.tar
#   moe      hotpath bench latency, Qwen3-30B-A3B shape, every engine default: batch 1 (with HF
#            transformers on the same shape), 8, 32 and 64 (MOE_BATCHES); an 8K-token prompt's TTFT
#   timeline the batch-1 decode graph of Qwen3-30B-A3B kernel by kernel (benchmarks/decode_timeline.py)
#   dense    Qwen3-8B and 0.6B batch 1 with this tree and with the tree before the change
#            (.before19/, an ignored copy the call carries), back to back
# Usage: bash scripts/gpu_moe.sh [tests] [tune] [moe] [timeline] [dense]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" $* "
bench="python3 -m hotpath.cli bench latency"
if [[ $what == *" tests "* ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_moe.py tests/ops/test_model_cuda.py \
    tests/ops/test_large_offsets.py 2>&1 | tee "$OUT/pytest_moe.log" | tail -8
fi
if [[ $what == *" tune "* ]]; then
  timeout ${TUNE_TIMEOUT:-200} python3 benchmarks/tune_moe.py --shapes qwen3-30b-a3b --quick \
    --tokens ${TUNE_TOKENS:-1 2 4 8 16 64 512 8192} 2>&1 | tail -30
  tar -C hotpath/ops/moe -cf "$OUT/moe_configs.tar" configs  # (their names do not come back as files)
fi
if [[ $what == *" moe "* ]]; then
  timeout 300 $bench --preset qwen3-30b-a3b --batch-size ${MOE_BATCHES:-1 8 32 64} --input-len 512 --output-len 128 \
    ${MOE_COMPARE:---compare hf} --json "$OUT/latency_qwen3-30b-a3b.json" 2>&1 | grep -vE "^\[bench\]|Loading|it/s"
  timeout 150 $bench --preset qwen3-30b-a3b --batch-size 1 --input-len 8192 --output-len 8 \
    --json "$OUT/latency_qwen3-30b-a3b_8k.json" 2>&1 | grep -E "TTFT|matmul"
fi
if [[ $what == *" timeline "* ]]; then
  (cd benchmarks && timeout 120 python3 decode_timeline.py --preset qwen3-30b-a3b --out "$OUT" 2>&1 | head -30)
fi
if [[ $what == *" dense "* ]]; then
  for p in qwen3-8b qwen3-0.6b; do
    for tree in .before19 .; do
      (cd $tree && PYTHONPATH=$PWD timeout 150 $bench --preset $p --batch-size 1 --input-len 512 --output-len 256 \
        --json "$OUT/latency_${p}_$( [[ $tree == . ]] && echo after || echo before ).json" 2>&1 | grep -E "TPOT") \
        | sed "s/^/$p $tree: /"
    done
  done
fi
