# Final GPU run of the session: the GPU-REQ suite on the committed code, then the SmolLM2
# and 1B benchmarks with async scheduling (the GEMV's tuning results cached on disk).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import triton, inspect; print('triton', triton.__version__, 'cache_results' in inspect.signature(triton.autotune).parameters)"
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -3
timeout 240 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes eager,full,full+async,compile+full,compile+full+async --compare-hf \
  --output $OUT/decode-graphs-cuda-async.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| (1|8) |compiled at|transformers:" | tail -6
timeout 200 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 --modes full,compile+full,compile+full+async \
  --model llama-3.2-1b-like --output $OUT/decode-graphs-cuda-llama1b-async.md 2>&1 \
  | tee $OUT/bench-1b.log | grep -E "^\| (1|8) |compiled at|captured" | tail -5
