# Programmatic dependent launch (GEMV and decode attention kernels): the whole GPU-REQ
# suite, then SmolLM2 and the 1B shape with and without it, alternating.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | grep -E "passed|failed|FAILED|Error" | tail -12
for pdl in 1 0 1 0; do
MINI_VLLM_PDL=$pdl timeout 100 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
  --modes full,compile+full+async --no-output 2>&1 | grep -E "^\| (1|8) |Traceback|Error" | sed "s/^/pdl=$pdl /"
done
for pdl in 1 0; do
MINI_VLLM_PDL=$pdl timeout 100 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1 --model llama-3.2-1b-like \
  --modes full,compile+full+async --no-output 2>&1 | grep -E "^\| (1|8) |Traceback|Error" | sed "s/^/1b pdl=$pdl /"
done
