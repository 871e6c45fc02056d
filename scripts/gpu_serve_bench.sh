#!/usr/bin/env bash
# Serving benchmark on the GPU: `hotpath serve` with random Qwen3-8B weights, loaded by
# `hotpath bench serve` over loopback. Needs the server's wheels in .whl/ (the device image lacks
# fastapi/uvicorn) and the Qwen3 tokenizer in .whl/qwen3-tokenizer/ (both from scripts/gpu_assets.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
model=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen3-8b'))")
python3 -m hotpath.cli serve --model "$model" --load-format dummy --tokenizer .whl/qwen3-tokenizer \
  --served-model-name qwen3-8b-dummy --max-model-len 4096 --port 8000 > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 1 180); do
  curl -sf http://127.0.0.1:8000/health > /dev/null && break
  sleep 1
done
python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 --dataset random \
  --input-len 512 --output-len 128 --num-prompts 64 --max-concurrency 1,8,32,64,128 --sweep \
  --output-json "$OUT/serve_h200_qwen3-8b.json" --output-plot "$OUT/serve_h200_qwen3-8b.png" \
  --label "H200, Qwen3-8B shape (random bf16 weights), random 512 in / 128 out" --no-progress
kill -TERM $server
wait $server
echo "server exit code $?"
tail -5 "$OUT/server.log"
