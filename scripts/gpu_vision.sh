#!/usr/bin/env bash
# Issue 33's GPU checks and figures (docs/benchmarks.md, "Vision"): the image-text models' GPU
# tests; bench latency with one 1280x1280 image + 100 text tokens on Qwen3-VL-8B (against HF
# transformers), Qwen3-VL-30B-A3B and Qwen3.5-35B-A3B (the tower alone on 1 and 8 images, the
# text-only TPOT beside); Qwen3-8B text decode against the tree before (.baseline/); 16 concurrent
# image chats through `hotpath serve`. Needs .whl/ (scripts/gpu_assets.sh) for the server.
# `compare`: Qwen3-VL-8B's image TTFT and TPOT, the tree in .baseline/ (a `git archive` of the commit
# before a change) and this one in turn, twice; `profile`: benchmarks/profile_vision.py.
# Usage: bash scripts/gpu_vision.sh [tests] [latency] [baseline] [compare] [profile] [preprocess] [serve]
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" ${*:-tests latency baseline preprocess serve} "
here=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
# the server's wheels, and httpx (media URLs), which the device image may lack
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
lat() { # tree name args...
  local tree=$1 name=$2; shift 2
  (cd "$tree" && PYTHONPATH=$PWD:/tmp/site python3 -m hotpath.cli bench latency "$@" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1)
  grep -E "TTFT|TPOT|tower|images|Error|error" "$OUT/$name.txt" | sed "s/^/$name: /" | tee -a "$OUT/summary.txt"
}
if [[ $what == *" tests "* ]]; then
  python3 -m pytest -q -rs tests/gpu/test_vl_gpu.py tests/ops/test_vision_attention.py tests/ops/test_norm.py tests/gpu/test_hf_parity_gpu.py \
    "tests/multimodal/test_processor.py::test_video_pixels_equal_transformers" > "$OUT/gpu_tests.txt" 2>&1
  grep -E "passed|failed|SKIP|FAIL|Error" "$OUT/gpu_tests.txt" | tail -15 | tee -a "$OUT/summary.txt"
fi
if [[ $what == *" latency "* ]]; then
  lat "$here" vl8b --preset qwen3-vl-8b --images 1 --image-size 1280x1280 --input-len 100 --output-len 128 --compare hf
  lat "$here" vl30b --preset qwen3-vl-30b-a3b --images 1 --image-size 1280x1280 --input-len 100 --output-len 128 \
    --max-model-len 32768
  lat "$here" q35_35b_vl --preset qwen3.5-35b-a3b-vl --images 1 --image-size 1280x1280 --input-len 100 --output-len 128 \
    --max-model-len 32768
fi
if [[ $what == *" baseline "* ]]; then
  for run in 1 2; do
    lat .baseline "base_qwen3-8b_$run" --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256
    lat "$here" "new_qwen3-8b_$run" --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256
  done
fi
if [[ $what == *" compare "* ]]; then
  for run in 1 2; do
    lat .baseline "base_vl8b_$run" --preset qwen3-vl-8b --images 1 --image-size 1280x1280 --input-len 100 --output-len 128
    lat "$here" "new_vl8b_$run" --preset qwen3-vl-8b --images 1 --image-size 1280x1280 --input-len 100 --output-len 128
  done
fi
if [[ $what == *" profile "* ]]; then
  python3 benchmarks/profile_vision.py --preset qwen3-vl-8b --image-size 1280x1280 --out "$OUT" > "$OUT/profile.txt" 2>&1
  grep -E "tower alone|generate wall|Error" "$OUT/profile.txt" | tee -a "$OUT/summary.txt"
fi
if [[ $what == *" preprocess "* ]]; then  # the server front end's host work alone
  python3 benchmarks/preprocess_bench.py --preset qwen3-vl-8b --num-images 16 --image-size 1280x1280 \
    --json "$OUT/preprocess_16.json" | tee -a "$OUT/summary.txt"
fi
if [[ $what == *" serve "* ]]; then
  tok=/tmp/qwen3-vl-tokenizer
  mkdir -p $tok && cp .whl/qwen3-tokenizer/* $tok/
  python3 - "$tok" <<'PY'
import json, sys
path = sys.argv[1] + "/tokenizer_config.json"
cfg = json.load(open(path))
cfg["chat_template"] = open("benchmarks/qwen3_vl_chat_template.jinja").read()
json.dump(cfg, open(path, "w"))
PY
  model=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen3-vl-8b'))")
  python3 -m hotpath.cli serve --model "$model" --load-format dummy --tokenizer $tok \
    --served-model-name qwen3-vl-8b-dummy --max-model-len 32768 --port 8000 > "$OUT/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    curl -sf http://127.0.0.1:8000/health > /dev/null && break
    sleep 1
  done
  python3 benchmarks/vision_serve.py --base-url http://127.0.0.1:8000/v1 --model qwen3-vl-8b-dummy \
    --num-requests 16 --image-size 1280x1280 --max-tokens 128 --output-json "$OUT/vision_serve_16${SERVE_TAG:-}.json" \
    2>&1 | tail -12 | tee -a "$OUT/summary.txt"
  kill -TERM $server
  wait $server
  tail -5 "$OUT/server.log"
fi
