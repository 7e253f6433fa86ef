#!/usr/bin/env bash
# The serving path of this checkout against another copy of mini_vllm, side by side on one
# GPU: one mixed step (16 decodes and a 512-token prompt, scripts/gpu/mixed_step.py), then
# the nano-vllm offline workload (scripts/gpu/throughput_workload.py) for each shape.
#
#     git archive <commit> mini_vllm | tar -x -C OLD
#     bash scripts/gpu/ab_serving.sh OLD [OUT]        # reports into OUT (default: out/gpu)
#     MODELS=smollm2-135m BIG= bash scripts/gpu/ab_serving.sh OLD   # fewer shapes
#
# The 8B shape runs with max_num_seqs 128: at 256 its KV cache for 2048-token requests
# would not fit beside its weights on an 80 GB card.
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD="$(cd "$1" && pwd)"
OUT="${2:-out/gpu}"
MODELS="${MODELS-smollm2-135m,llama-3.2-1b-like}"
BIG="${BIG-llama-3.1-8b-like}"  # BIG= (empty) leaves the 8B shape out
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 scripts/gpu/mixed_step.py "$OLD" --out "$OUT"
for version in old new; do
  path=""; [ "$version" = old ] && path="$OLD"
  PYTHONPATH="$path" python3 scripts/gpu/throughput_workload.py --models "$MODELS" \
    --out "$OUT/throughput-$version.md"
  [ -n "$BIG" ] && PYTHONPATH="$path" python3 scripts/gpu/throughput_workload.py --models "$BIG" \
    --max-num-seqs 128 --out "$OUT/throughput-$version-8b.md"
done
python3 scripts/gpu/throughput_workload.py --models "$MODELS" --engine-option async_scheduling=true \
  --out "$OUT/throughput-new-async.md"
python3 scripts/gpu/throughput_workload.py --models smollm2-135m --num-prompts 128 --profile 128 \
  --out "$OUT/throughput-new-profile.md"
