#!/usr/bin/env bash
# The GPU-REQ suite: every test marked `gpu` (the package's tests, and the labs against the
# reference), failing instead of skipping where CUDA is missing; then the cells of the
# CUDA-graph notebook, whose GPU branches only run on a GPU; then every measuring script
# of scripts/gpu/ once (each checks that it still runs; their numbers are in the reports).
#
#     bash scripts/gpu/suite.sh [OUT]        # logs and reports into OUT (default: out/gpu)
#     GPU_SUITE_SKIP_SCRIPTS=1 bash scripts/gpu/suite.sh OUT   # without the measuring scripts
#
# Exit status: that of the tests, or of the first step after them that failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m mini_vllm doctor > "$OUT/doctor.txt" || true  # informative: the weights package may be absent
# The server's test files have no GPU test, and they import the serving extra (openai,
# fastapi), which a GPU machine set up for the engine alone may lack: leave them out there.
# -v: each test's name and outcome in the log as it runs, so a run cut short still says which.
ignore=()
if ! python3 -c "import openai, fastapi, uvicorn" 2>/dev/null; then
  for file in tests/engine/test_serve.py tests/engine/test_serve_hardening.py \
    tests/engine/test_serve_sampling.py; do
    ignore+=("--ignore=$file")
  done
fi
python3 -m pytest -m gpu --require-gpu -p no:cacheprovider -v -rfEs "${ignore[@]}" tests labs --impl=ref \
  2>&1 | tee "$OUT/gpu-suite.log" | tail -5
python3 scripts/gpu/run_notebook_cells.py notebooks/phase-05-cuda-graphs.ipynb \
  --write-outputs "$OUT/phase-05-cuda-graphs.ipynb" > "$OUT/notebook-phase-05-cuda-graphs.log" 2>&1
echo "notebook phase-05-cuda-graphs: every cell ran; executed copy: $OUT/phase-05-cuda-graphs.ipynb"
[ "${GPU_SUITE_SKIP_SCRIPTS:-0}" = 1 ] && exit 0  # the tests and the notebook only
for script in host_launch_costs gemv_tiles skinny_gemm split_decode decode_attention_tiles graph_launch_cost \
  step_profile host_profile startup_profile capture_profile tile_timing; do
  python3 "scripts/gpu/$script.py" --out "$OUT" > "$OUT/$script.log" 2>&1
  echo "scripts/gpu/$script.py: ran (report: $OUT/$script.txt)"
done
