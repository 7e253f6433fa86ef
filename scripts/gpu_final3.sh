# GPU run for the session's final state: the GPU-REQ suite (package + labs) and the
# Phase 05 notebooks' cells with their CUDA branches.
set -o pipefail
export PYTHONUNBUFFERED=1 MINI_VLLM_CACHE=/tmp/mini_vllm_cache MPLBACKEND=Agg
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -q -rs tests labs --impl=ref 2>&1 | tee $OUT/gpu-suite.log | tail -8
for nb in notebooks/phase-05-cuda-graphs.ipynb; do
  PYTHONPATH=. timeout 240 python3 scripts/run_notebook_cells.py $nb > $OUT/$(basename $nb .ipynb).log 2>&1; echo "$nb rc=$?"
  grep -iE "cuda|H100|ms|hit rate|graph" $OUT/$(basename $nb .ipynb).log | tail -15
done
