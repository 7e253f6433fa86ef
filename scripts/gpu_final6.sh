# GPU run: the GPU-REQ suite, then both decode benchmarks (SmolLM2 shape, Llama-3.2-1B shape),
# with the step timed free of syncs and transformers timed before and after our modes.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -3
timeout 330 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 \
  --modes eager,full,piecewise,compile+full,compile+piecewise --compare-hf \
  --output $OUT/decode-graphs-cuda.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| 1 |predicts" | tail -3
timeout 200 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8,32 --modes eager,full,compile+full \
  --model llama-3.2-1b-like --compare-hf --output $OUT/decode-graphs-cuda-llama1b.md 2>&1 \
  | tee $OUT/bench-1b.log | grep -E "^\| 1 |compiled at" | tail -3
