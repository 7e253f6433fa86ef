# GPU run for the Triton GEMV: its tests and the async ones first, the whole GPU-REQ suite,
# then SmolLM2 and Llama-3.2-1B shapes (sync and async) side by side.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -x tests/test_triton_gemv.py tests/test_async_scheduling.py 2>&1 | tail -3
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -3
timeout 240 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes eager,full,full+async,compile+full,compile+full+async --compare-hf \
  --output $OUT/decode-graphs-cuda-async.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| (1|8) |compiled at" | tail -4
timeout 200 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 --modes full,compile+full,compile+full+async \
  --model llama-3.2-1b-like --output $OUT/decode-graphs-cuda-llama1b-async.md 2>&1 \
  | tee $OUT/bench-1b.log | grep -E "^\| (1|8) |compiled at" | tail -3
