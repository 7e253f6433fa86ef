# Phase 05 on the GPU machine: the GPU-REQ suite, lab 04's recorded run, the decode benchmark.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider tests 2>&1 | tee $OUT/gpu-tests.log | tail -4
python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider --impl=ref labs 2>&1 | tee $OUT/gpu-labs.log | tail -4
mkdir -p labs/lab-04-graph-vs-eager-real/recorded
python3 -m mini_vllm.bench.itl --out labs/lab-04-graph-vs-eager-real/recorded/h100-itl.json 2>&1 | tee $OUT/itl.log
cp labs/lab-04-graph-vs-eager-real/recorded/h100-itl.json $OUT/
python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,2,4,8,16,32,64 --modes eager,full,piecewise --compare-hf 2>&1 | tee $OUT/bench.log | tail -30
cp benchmarks/results/decode-graphs-cuda.md $OUT/
