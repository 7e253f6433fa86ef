# The fusion passes' recorded run: SmolLM2 (every compiled variant against FULL and
# transformers, kernels per step), the 1B shape, and the fused step's kernel profile.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes full,full+async,compile-nofusion+full,compile+full,compile-nofusion+full+async,compile+full+async --compare-hf \
  --output $OUT/decode-graphs-cuda-fusion.md 2>&1 | tee $OUT/bench-smollm2.log | grep -E "^\| (1|8) |transformers:|compiled at|Traceback|Error" | tail -12
timeout 130 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes full,compile-nofusion+full+async,compile+full+async \
  --model llama-3.2-1b-like --output $OUT/decode-graphs-cuda-llama1b-fusion.md 2>&1 \
  | tee $OUT/bench-1b.log | grep -E "^\| (1|8) |Traceback|Error" | tail -5
timeout 60 python3 scripts/gpu_gemv_tiles.py 2>&1 | tee $OUT/gemv-tiles.txt
MINI_VLLM_PDL=0 timeout 90 python3 scripts/gpu_step_profile.py > $OUT/profile.txt 2>&1; grep -E "kernel|triton_|void|Self CUDA time" $OUT/profile.txt | head -12
