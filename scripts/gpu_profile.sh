set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
timeout 200 python3 scripts/gpu_step_profile.py smollm2-135m 2>&1 | grep -v "^$" | head -80
