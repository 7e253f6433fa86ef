# GPU run for the fusion pass: its GPU-REQ tests, then SmolLM2 with and without it.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs -x tests/test_fusion.py tests/test_triton_gemv.py 2>&1 | tee $OUT/gpu-fusion-tests.log | tail -15
timeout 300 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes full,compile-nofusion+full,compile+full,full+async,compile-nofusion+full+async,compile+full+async --compare-hf \
  --output $OUT/decode-graphs-cuda-fusion.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| (1|8) |compiled at|transformers:|Traceback|Error" | tail -16
timeout 120 python3 scripts/gpu_step_profile.py > $OUT/profile.txt 2>&1; tail -25 $OUT/profile.txt
