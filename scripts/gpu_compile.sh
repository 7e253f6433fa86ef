# torch.compile on the GPU machine: GPU-REQ tests, then the decode benchmark with compiled modes.
set -o pipefail
export PYTHONUNBUFFERED=1
export MINI_VLLM_CACHE=/tmp/mini_vllm_cache
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider tests labs --impl=ref -x 2>&1 | tee $OUT/gpu-tests.log | tail -5
timeout 420 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 \
  --modes eager,full,piecewise,compile+full,compile+piecewise --compare-hf 2>&1 | tee $OUT/bench-smollm2.log | grep -v "^$" | tail -40
cp benchmarks/results/decode-graphs-cuda.md $OUT/ 2>/dev/null
