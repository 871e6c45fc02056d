#!/usr/bin/env bash
# Issue 22's GPU checks and figures (speculative decoding), for a few device calls:
#   tests    tests/gpu/test_speculative_gpu.py: greedy equality on the GPU paths, a real-shaped run
#   costs    step costs at each fixed k (benchmarks/spec_step_costs.py, random weights) and the
#            speed-up they model with the real pair's CPU-measured acceptance: the 32B shape
#            drafted by the 0.5B, the 1.5B by the 0.5B, the 1.5B verifying n-gram drafts
#   batch    the adaptive choice of k against speculation off at batch 1, 8, 32 and 64
#   mtp      the MTP head's step costs on the Qwen3.5-9B shape against plain decode
# Usage: bash scripts/gpu_spec.sh [tests] [costs] [batch] [mtp]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hotpath-gpu}
mkdir -p "$OUT"
what=" $* "
bench="python3 -m hotpath.cli bench latency"
quiet() { grep -vE "^\[bench\]|Loading|it/s"; }
if [[ $what == *" tests "* ]]; then
  timeout 480 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_speculative_gpu.py 2>&1 \
    | tee "$OUT/pytest_spec.log" | tail -20
fi
if [[ $what == *" costs "* ]]; then
  # step costs at each fixed k, and the speed-up they give with the real pair's measured acceptance
  costs="python3 benchmarks/spec_step_costs.py"
  timeout 200 $costs --preset qwen2.5-coder-32b --draft-preset qwen2.5-coder-0.5b \
    --acceptance docs/bench/spec_acceptance_draft_model.json --json "$OUT/spec_costs_32b_0.5b.json" 2>&1 | quiet
  timeout 100 $costs --preset qwen2.5-coder-1.5b --draft-preset qwen2.5-coder-0.5b \
    --acceptance docs/bench/spec_acceptance_draft_model.json --json "$OUT/spec_costs_1.5b_0.5b.json" 2>&1 | quiet
  timeout 100 $costs --preset qwen2.5-coder-1.5b --verify-only --ks 0,1,2,3,4,5,7 \
    --acceptance docs/bench/spec_acceptance_ngram_edit.json --json "$OUT/spec_costs_1.5b_ngram.json" 2>&1 | quiet
fi
if [[ $what == *" mtp "* ]]; then
  # the MTP head's step costs on a Qwen3.5 shape (no real head here: costs only), against plain decode
  timeout 150 $bench --preset qwen3.5-9b --batch-size 1 --input-len 512 --output-len 64 \
    --json "$OUT/spec_mtp_9b_none.json" 2>&1 | quiet
  timeout 200 python3 benchmarks/spec_step_costs.py --preset qwen3.5-9b --mtp --ks 0,1,2,3 \
    --json "$OUT/spec_costs_9b_mtp.json" 2>&1 | quiet
fi
if [[ $what == *" batch "* ]]; then
  # the automatic choice of k against speculation off, random weights: n-gram on Qwen3-8B, the
  # 0.5B drafting for the 1.5B (random drafts: nearly nothing accepted, so the policy must turn
  # speculation off and cost no more than noise)
  for spec in none ngram; do
    cfg=(); [[ $spec == ngram ]] && cfg=(--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}')
    timeout 150 $bench --preset qwen3-8b --batch-size 1 8 32 64 --input-len 512 --output-len 256 \
      "${cfg[@]}" --json "$OUT/spec_batch_8b_$spec.json" 2>&1 | quiet
  done
  draft=$(python3 -c "from hotpath.bench.presets import preset_dir; print(preset_dir('qwen2.5-coder-0.5b'))")
  for spec in none draft; do
    cfg=(); [[ $spec == draft ]] && cfg=(--speculative-config "{\"method\": \"draft_model\", \"model\": \"$draft\", \"num_speculative_tokens\": 4}")
    timeout 120 $bench --preset qwen2.5-coder-1.5b --batch-size 1 8 32 64 --input-len 512 --output-len 256 \
      "${cfg[@]}" --json "$OUT/spec_batch_1.5b_$spec.json" 2>&1 | quiet
  done
fi
