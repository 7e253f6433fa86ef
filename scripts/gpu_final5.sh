# GPU run after the CPU split-K linear and the profile-based simulator refit:
# the GPU-REQ suite and where a compiled + FULL step's GPU time goes (part 1), then the
# SmolLM2-shape decode benchmark (part 2: `bash scripts/gpu_final5.sh bench`).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = "bench" ]; then
  timeout 540 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 \
    --modes eager,full,piecewise,compile+full,compile+piecewise --compare-hf \
    --output $OUT/decode-graphs-cuda.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| 1 |refit|FULL" | tail -8
else
  python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -4
  timeout 200 python3 scripts/gpu_step_profile.py smollm2-135m > $OUT/step-profile.log 2>&1
  grep -v "^$" $OUT/step-profile.log | tail -30
fi
