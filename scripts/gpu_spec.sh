#!/usr/bin/env bash
# Issue 22's GPU checks and figures (speculative decoding), for a few device calls:
#   tests    tests/gpu/test_speculative_gpu.py: greedy equality on the GPU paths, a real-shaped run
#   costs    the step costs behind the modelled speed-up: Qwen2.5-Coder-32B shape drafted by the
#            0.5B shape (random weights), batch 1, each fixed k against speculation off (with
#            random weights nothing is accepted, so TPOT = the time of one step with k drafts)
#   batch    the adaptive choice of k against speculation off at batch 1, 8, 32 and 64 (Qwen3-8B
#            shape, n-gram drafts over random prompts: nearly nothing accepted, so the adaptive
#            policy must fall back to k = 0 and cost no more than noise)
# Usage: bash scripts/gpu_spec.sh [tests] [costs] [batch]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" $* "
bench="python3 -m hotpath.cli bench latency"
quiet() { grep -vE "^\[bench\]|Loading|it/s"; }
if [[ $what == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_speculative_gpu.py 2>&1 \
    | tee "$OUT/pytest_spec.log" | tail -20
fi
if [[ $what == *" costs "* ]]; then
  draft=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen2.5-coder-0.5b'))")
  timeout 150 $bench --preset qwen2.5-coder-32b --batch-size 1 --input-len 512 --output-len 64 \
    --json "$OUT/spec_costs_k0.json" 2>&1 | quiet
  for k in 1 2 3 4 6; do
    timeout 150 $bench --preset qwen2.5-coder-32b --batch-size 1 --input-len 512 --output-len 64 \
      --speculative-config "{\"method\": \"draft_model\", \"model\": \"$draft\", \"num_speculative_tokens\": $k, \"adaptive\": false}" \
      --json "$OUT/spec_costs_k$k.json" 2>&1 | quiet
  done
fi
if [[ $what == *" batch "* ]]; then
  for spec in none ngram; do
    cfg=(); [[ $spec == ngram ]] && cfg=(--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}')
    timeout 250 $bench --preset qwen3-8b --batch-size 1 8 32 64 --input-len 512 --output-len 256 \
      "${cfg[@]}" --json "$OUT/spec_batch_$spec.json" 2>&1 | quiet
  done
fi
