#!/usr/bin/env bash
# Issue 32's one-GPU figures (docs/benchmarks.md, "Parallelism"): TP=1 through the executor against
# the tree before it (.baseline/, the same commands in turn on the same GPU), one rank in a worker
# process of its own, and each rank's step of Qwen3-235B-A22B FP8 at TP8 / EP8
# (benchmarks/qwen3_235b_ranks.py). Usage: bash scripts/gpu_parallel.sh [latency] [moe] [throughput] [ranks]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" ${*:-latency moe throughput ranks} "
here=$PWD
lat() { # tree name args...: bench latency from that tree, its JSON under $OUT/name.json
  local tree=$1 name=$2; shift 2
  (cd "$tree" && PYTHONPATH=$PWD python3 -m hotpath.cli bench latency "$@" --json "$OUT/$name.json" 2>&1 \
     | grep -E "TPOT|tokens/s|Error|error" | tee -a "$OUT/summary.txt" | sed "s/^/$name: /")
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
if [[ $what == *" latency "* ]]; then
  for p in qwen3-8b qwen3-0.6b; do
    lat .baseline "base_$p" --preset $p --batch-size 1 --input-len 512 --output-len 256
    lat "$here" "new_$p" --preset $p --batch-size 1 --input-len 512 --output-len 256
  done
  lat "$here" "new_mp_qwen3-8b" --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256 \
      --distributed-executor-backend mp
  lat "$here" "new_qwen3-8b_again" --preset qwen3-8b --batch-size 1 --input-len 512 --output-len 256
fi
if [[ $what == *" moe "* ]]; then
  for p in qwen3-30b-a3b qwen3.5-9b; do
    lat .baseline "base_$p" --preset $p --batch-size 1 --input-len 512 --output-len 256
    lat "$here" "new_$p" --preset $p --batch-size 1 --input-len 512 --output-len 256
  done
fi
if [[ $what == *" throughput "* ]]; then
  # in turn, twice each: the mixed workload's spread between runs is a few percent
  for run in 1 2; do
    for tree in "$here" .baseline; do
      name=$([[ $tree == .baseline ]] && echo base || echo new)_$run
      (cd "$tree" && PYTHONPATH=$PWD python3 -m hotpath.cli bench throughput --preset qwen3-8b --no-phases \
         --json "$OUT/throughput_$name.json" 2>&1 | grep workload | sed "s/^/throughput $name: /")
    done
  done
fi
if [[ $what == *" ranks "* ]]; then
  python3 benchmarks/qwen3_235b_ranks.py write /tmp/ranks >/dev/null
  lat "$here" rank_tp8 --model /tmp/ranks/tp8 --load-format dummy --batch-size 1 64 --input-len 512 --output-len 64
  lat "$here" rank_ep8_bs1 --model /tmp/ranks/ep8_bs1 --load-format dummy --batch-size 1 --input-len 512 --output-len 64
  lat "$here" rank_ep8_bs64 --model /tmp/ranks/ep8_bs64 --load-format dummy --batch-size 64 --input-len 512 --output-len 64
  python3 benchmarks/qwen3_235b_ranks.py model "$OUT" "$OUT/qwen3_235b_model.json" | tee -a "$OUT/summary.txt"
fi
