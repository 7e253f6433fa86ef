set -o pipefail
export PYTHONUNBUFFERED=1
export MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider tests/test_paged_attention.py tests/test_cudagraph_runner.py -x 2>&1 | tail -3
timeout 240 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8,64 \
  --modes eager,full,compile+full,compile+piecewise --compare-hf --output $OUT/smollm2.md 2>&1 | grep -E "^\| |refit|compiled|engine ready" | tail -14
timeout 150 python3 -m mini_vllm bench decode --device cuda --model llama-3.2-1b-like --batch-sizes 1,8 \
  --modes eager,full,compile+full --output $OUT/llama1b.md 2>&1 | grep -E "^\| |compiled|engine ready" | tail -8
timeout 60 python3 scripts/gpu_step_profile.py 2>&1 | head -45 | tail -32
