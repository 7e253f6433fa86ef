# Final GPU run, part 2: the Llama-3.2-1B shape against the weight-read floor, and
# transformers with a static cache and torch.compile (H100).
set -o pipefail
export PYTHONUNBUFFERED=1 MINI_VLLM_CACHE=/tmp/mini_vllm_cache
timeout 240 python3 -m mini_vllm bench decode --device cuda --model llama-3.2-1b-like --batch-sizes 1,8,32 \
  --modes eager,full,compile+full --compare-hf --output $OUT/decode-graphs-cuda-llama1b.md 2>&1 \
  | tee $OUT/bench-llama1b.log | grep -E "^\| |compiled at" | tail -6
timeout 300 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1 --modes compile+full \
  --compare-hf-compile --output $OUT/hf-compile-smollm2.md 2>&1 | tee $OUT/hf-compile.log | grep -E "transformers|^\| 1" | tail -4
