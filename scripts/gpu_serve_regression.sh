#!/usr/bin/env bash
# The server's throughput, the tree in .baseline/ (a `git archive` of an older commit) against this
# one, in one device call: `hotpath serve` (engine process, Qwen3-8B shape, random weights, the
# Qwen3 tokenizer) loaded by `hotpath bench serve` with N random prompts all at once.
# Needs .whl/ (scripts/gpu_assets.sh). Usage: bash scripts/gpu_serve_regression.sh [N] [IN] [OUT_LEN]
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/hotpath-gpu}
n=${1:-1000}; in_len=${2:-256}; out_len=${3:-128}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
here=$PWD
for tree in .baseline "$here"; do
  name=$([[ $tree == .baseline ]] && echo base || echo new)
  (cd "$tree" && export PYTHONPATH=$PWD:/tmp/site
   model=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen3-8b'))")
   python3 -m hotpath.cli serve --model "$model" --load-format dummy --tokenizer "$here/.whl/qwen3-tokenizer" \
     --port 8000 > "$OUT/server_$name.log" 2>&1 &
   server=$!
   for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
   python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 --dataset random --num-prompts "$n" \
     --input-len "$in_len" --output-len "$out_len" --max-concurrency "$n" --num-warmup 8 --no-progress \
     --output-json "$OUT/serve_$name.json" 2>&1 | tail -6 | sed "s/^/$name: /"
   kill -TERM $server; wait $server)
done
