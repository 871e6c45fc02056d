#!/usr/bin/env bash
# Issue 35's GGUF part on a GPU, in one device call (carry: [".whl"] for the gguf wheel):
#   tests    the GGUF kernel on the GPU (every type, 1..1000 rows, fused forms, a CUDA graph) and the
#            tiny GGUF kept quantized against its 16-bit copy through LLM at every default
#   models   for each layout (benchmarks/gguf_layouts: the real files' types and shapes, random
#            blocks): `hotpath bench latency` at batch 1 / 8 / 32 kept quantized and on the 16-bit copy
#   kernels  each linear's GGUF kernel against bf16 at 1..64 rows (weight bytes / time); SWEEP=1:
#            tile configs too, at 1 and 16 rows on two shapes
# Usage: bash scripts/gpu_gguf.sh [tests] [models] [kernels]
set -uo pipefail
export PYTHONUNBUFFERED=1 HOTPATH_CACHE=/tmp/hotpath-cache
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf-*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
what=" $* "
layouts=${LAYOUTS:-qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m}
if [[ $what == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/ops/test_gguf_kernel.py \
    tests/loader/test_gguf_quantized.py -k cuda 2>&1 | tee "$OUT/pytest_gguf.log" | tail -15
fi
if [[ $what == *" models "* ]]; then
  for l in $layouts; do
    timeout 150 python3 benchmarks/gguf_decode.py build benchmarks/gguf_layouts/$l.json /tmp/gguf/$l 2>&1 | tail -2
    for side in gguf bf16; do
      q=""; [[ $side == gguf ]] && q="--quantization gguf"
      timeout 200 python3 -m hotpath.cli bench latency --model /tmp/gguf/$l/$side-dir $q --batch-size 1 8 32 \
        --input-len 512 --output-len 128 --json "$OUT/latency_${l}_$side.json" 2>&1 \
        | grep -vE "^\[bench\]|Loading|it/s|tensor/s" | sed "s/^/$side: /"
    done
  done
fi
if [[ $what == *" kernels "* ]]; then
  for l in $layouts; do
    timeout 240 python3 benchmarks/gguf_decode.py kernels benchmarks/gguf_layouts/$l.json ${SWEEP:+--sweep} \
      --json "$OUT/kernels_$l.json" 2>&1 | tail -80
  done
fi
