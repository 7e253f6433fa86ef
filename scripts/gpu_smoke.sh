set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider tests 2>&1 | tee $OUT/gpu-tests.log | tail -25
MINI_VLLM_IMPL=ref python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider --impl=ref labs/lab-04-graph-vs-eager-real 2>&1 | tail -8
timeout 200 python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 --modes eager,full,piecewise --steps 10 --compare-hf --no-output 2>&1 | tail -20
