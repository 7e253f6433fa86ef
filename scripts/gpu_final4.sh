# GPU run with the Triton RMSNorm: the GPU-REQ suite, then the SmolLM2-shape decode benchmark.
set -o pipefail
export PYTHONUNBUFFERED=1 MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -4
timeout 420 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 \
  --modes eager,full,piecewise,compile+full,compile+piecewise --compare-hf \
  --output $OUT/decode-graphs-cuda.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| 1 |refit|compiled at|FULL" | tail -8
