#!/usr/bin/env bash
# The serving path of this checkout against another copy of mini_vllm, side by side on one
# GPU: one mixed step (16 decodes and a 512-token prompt, scripts/gpu/mixed_step.py), then
# the nano-vllm offline workload (scripts/gpu/throughput_workload.py) for each shape, this
# checkout both with and without async scheduling.
#
#     git archive <commit> mini_vllm | tar -x -C OLD
#     bash scripts/gpu/ab_serving.sh OLD [OUT]        # reports into OUT (default: out/gpu)
#     MODELS=smollm2-135m BIG= bash scripts/gpu/ab_serving.sh OLD   # fewer shapes
#
# MODELS run for both copies; BIG (default: the 8B shape; empty: none) for this checkout
# only; MIXED_SETTINGS are mixed_step.py's --settings for this checkout (the other copy
# runs its default).
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD="$(cd "$1" && pwd)"
OUT="${2:-out/gpu}"
MODELS="${MODELS-smollm2-135m,llama-3.2-1b-like}"
BIG="${BIG-llama-3.1-8b-like}"
MIXED_SETTINGS="${MIXED_SETTINGS-default,ladder-1024}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 scripts/gpu/mixed_step.py "$OLD" --settings "$MIXED_SETTINGS" --repeats 10 --out "$OUT"
PYTHONPATH="$OLD" python3 scripts/gpu/throughput_workload.py --models "$MODELS" \
  --out "$OUT/throughput-old.md"
ALL="$MODELS${BIG:+,$BIG}"
python3 scripts/gpu/throughput_workload.py --models "$ALL" --out "$OUT/throughput-new.md"
python3 scripts/gpu/throughput_workload.py --models "$ALL" --engine-option async_scheduling=true \
  --out "$OUT/throughput-new-async.md"
