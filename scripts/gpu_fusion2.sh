# GPU run for the fusion pass (one-pass norm prologue, Triton silu_and_mul): tests, SmolLM2
# with and without the pass, the 1B shape, and a kernel profile of the fused step.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs -x tests/test_fusion.py 2>&1 | tee $OUT/gpu-fusion-tests.log | tail -3
timeout 250 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes full,full+async,compile-nofusion+full,compile+full,compile-nofusion+full+async,compile+full+async --compare-hf \
  --output $OUT/decode-graphs-cuda-fusion.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| (1|8) |transformers:|Traceback|Error" | tail -8
timeout 120 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 --modes full,compile+full,compile+full+async \
  --model llama-3.2-1b-like --output $OUT/decode-graphs-cuda-llama1b-fusion.md 2>&1 \
  | tee $OUT/bench-1b.log | grep -E "^\| (1|8) |Traceback|Error" | tail -5
timeout 60 python3 scripts/gpu_step_profile.py > $OUT/profile.txt 2>&1; grep -E "kernel|triton|void|Self CUDA time" $OUT/profile.txt | head -12
