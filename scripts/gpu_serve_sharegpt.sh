#!/usr/bin/env bash
# ShareGPT through `hotpath serve` (engine process) at unlimited concurrency against the same
# requests through LLM.generate (`hotpath bench throughput --dataset sharegpt`), one device call.
# Qwen3-8B shape, random weights, the Qwen3 tokenizer and chat template. Needs .whl/ and .gpu_assets/
# (made by scripts/gpu_assets.sh: the device has no network), carried with the call.
# Usage: bash scripts/gpu_serve_sharegpt.sh [NUM_PROMPTS] [OUTPUT_LEN]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
n=${1:-2000}
out_len=${2:-128}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site HOTPATH_CACHE=/tmp/hotpath-cache
mkdir -p $HOTPATH_CACHE/datasets/sharegpt
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu_assets/sharegpt.json.xz $HOTPATH_CACHE/datasets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
model=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen3-8b'))")
tok=.whl/qwen3-tokenizer
python3 -m hotpath.cli serve --model "$model" --load-format dummy --tokenizer $tok --port 8000 > "$OUT/server_sharegpt.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 --dataset sharegpt --num-prompts "$n" \
  --output-len "$out_len" --max-concurrency "$n" --num-warmup 8 --no-progress \
  --output-json "$OUT/serve_sharegpt.json" --label "H200, Qwen3-8B shape, engine process" 2>&1 | tail -4
kill -TERM $server; wait $server; echo "server exit code $?"
python3 -m hotpath.cli bench throughput --model "$model" --load-format dummy --tokenizer $tok --dataset sharegpt \
  --num-prompts "$n" --output-len "$out_len" --no-phases --json "$OUT/offline_sharegpt.json" 2>&1 | tail -3
