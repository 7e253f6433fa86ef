# Final GPU run, part 1: the GPU-REQ suite and the SmolLM2-shape decode benchmark (H100).
set -o pipefail
export PYTHONUNBUFFERED=1 MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -4
timeout 400 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 \
  --modes eager,full,piecewise,compile+full,compile+piecewise --compare-hf \
  --output $OUT/decode-graphs-cuda.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| 1 |refit|compiled at" | tail -6
