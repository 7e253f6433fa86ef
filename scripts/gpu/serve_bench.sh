#!/usr/bin/env bash
# Serving on a GPU, side by side: the SmolLM2-135M shape (random weights: timing does not
# depend on the values) served by `python -m mini_vllm bench serve` (its own server, then
# one run per request rate) in each configuration asked for. The load is the serving
# target's: 512 requests, prompts of 128 +- 64 tokens, 64 +- 32 new tokens (EOS ignored),
# all at once ("inf", saturation) and at 16 requests/s (a Poisson process).
#
#     bash scripts/gpu/serve_bench.sh [OUT]      # default OUT: out/serve-bench
#     SERVE_CONFIGS=eager,full_and_piecewise bash scripts/gpu/serve_bench.sh OUT
#     PROMPTS=100 RATES=4,16,inf bash scripts/gpu/serve_bench.sh OUT
#
# Configurations (SERVE_CONFIGS, comma-separated; default: full_and_piecewise and
# full_and_piecewise+async): eager (--enforce-eager), full_and_piecewise (the default
# engine: FULL_AND_PIECEWISE graphs), full_and_piecewise+async (with --async-scheduling),
# compile+full_and_piecewise+async (also --compilation-mode vllm_compile),
# full_and_piecewise+thread (the engine core in a thread of the server's process,
# MINI_VLLM_ENABLE_MULTIPROCESSING=0, instead of a process of its own). Each uses the
# server's defaults for the GPU (max_num_seqs and max_num_batched_tokens as vLLM's).
# Writes OUT/serve-<config>.{md,json,png,log} ('+' in a configuration's name becomes '_')
# and OUT/serve-cuda.md, the table of P50/P99 ITL, TTFT and throughput per configuration
# and rate. A configuration is cut off after 190 s, and one that would start after 280 s
# is skipped: 8 minutes at most.
#
# The server needs fastapi and uvicorn. Where they are missing and no index can be reached,
# the script installs them from a folder of wheels, $MINI_VLLM_WHEELS (default .whl), into
# OUT/pkgs; make that folder where an index is reachable, for the GPU's Python, e.g.
#     python3 -m pip download --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d .whl fastapi uvicorn pyzmq
#
# MINI_VLLM_SERVE_BENCH_CPU=1 runs the same steps on the CPU with the tiny model and a small
# load (about a minute and a half): a check that the script works, not a measurement.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-out/serve-bench}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONUNBUFFERED=1
START=$SECONDS
say() { echo "[serve_bench +$((SECONDS - START))s] $*"; }

if [ "${MINI_VLLM_SERVE_BENCH_CPU:-0}" = 1 ]; then
  MODEL=tiny DEVICE=cpu PROMPTS=${PROMPTS:-12} RATES=${RATES:-20,inf} IN_LEN=32 OUT_LEN=16
  EXTRA="--cpu-threads 1"
  REPORT="$OUT/serve-cpu-check.md"
else
  MODEL=smollm2-135m DEVICE=cuda PROMPTS=${PROMPTS:-512} RATES=${RATES:-16,inf} IN_LEN=128
  OUT_LEN=64 EXTRA=""
  REPORT="$OUT/serve-cuda.md"
  if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: scripts/gpu/serve_bench.sh needs an NVIDIA GPU with CUDA" \
      "(MINI_VLLM_SERVE_BENCH_CPU=1 runs the same steps on the CPU)" >&2
    exit 2
  fi
fi

PACKAGES="import fastapi, uvicorn, pydantic, prometheus_client, httpx, zmq"
if ! python3 -c "$PACKAGES" 2>/dev/null; then
  WHEELS="${MINI_VLLM_WHEELS:-.whl}"
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "error: the server's packages (fastapi, uvicorn, ...) are missing and $WHEELS holds" \
      "no wheels; see this script's header for how to make that folder" >&2
    exit 2
  fi
  say "installing fastapi and uvicorn from $WHEELS into $OUT/pkgs"
  python3 -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
    --no-deps --target "$OUT/pkgs" "$WHEELS"/*.whl
  export PYTHONPATH="$OUT/pkgs${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c "$PACKAGES"
fi

ALL_CONFIGS=(
  "eager|--enforce-eager"
  "full_and_piecewise|--cudagraph-mode full_and_piecewise"
  "full_and_piecewise+thread|--cudagraph-mode full_and_piecewise|MINI_VLLM_ENABLE_MULTIPROCESSING=0"
  "full_and_piecewise+async|--cudagraph-mode full_and_piecewise --async-scheduling"
  "compile+full_and_piecewise+async|--cudagraph-mode full_and_piecewise --compilation-mode vllm_compile --async-scheduling"
)
WANTED=",${SERVE_CONFIGS:-full_and_piecewise,full_and_piecewise+async},"
known=",$(printf '%s,' "${ALL_CONFIGS[@]%%|*}")"
IFS=, read -ra asked <<< "${WANTED:1:-1}"
for label in "${asked[@]}"; do
  if [[ "$known" != *",$label,"* ]]; then
    echo "error: SERVE_CONFIGS names $label; the configurations are ${known:1:-1}" >&2
    exit 2
  fi
done
status=0
results=()
for config in "${ALL_CONFIGS[@]}"; do
  label="${config%%|*}"
  flags="${config#*|}"
  envs=""  # a third field: VAR=value settings for the server
  if [[ "$flags" == *"|"* ]]; then
    envs="${flags#*|}"
    flags="${flags%%|*}"
  fi
  [[ "$WANTED" == *",$label,"* ]] || continue
  stem="serve-${label//+/_}"  # file names without '+'
  if [ $((SECONDS - START)) -gt 280 ]; then
    say "skipping $label: the 8-minute budget would not hold it"
    status=1
    continue
  fi
  say "$label: a server with $flags; $PROMPTS requests at each rate of $RATES"
  # shellcheck disable=SC2086  # the flags are words
  if env $envs timeout --kill-after=10 190 python3 -m mini_vllm bench serve --model "$MODEL" \
    --device "$DEVICE" $flags $EXTRA --num-prompts "$PROMPTS" --random-input-len "$IN_LEN" \
    --random-output-len "$OUT_LEN" --random-range-ratio 0.5 --ignore-eos \
    --request-rate "$RATES" --label "$label" --server-timeout 120 --request-timeout 60 \
    --output "$OUT/$stem.md" --save-json "$OUT/$stem.json" \
    > "$OUT/$stem.log" 2>&1; then
    grep -E "^(server ready|run:|  [0-9]+ done)" "$OUT/$stem.log" | sed 's/^/    /'
    results+=("$OUT/$stem.json")
  else
    code=$?
    say "$label FAILED (status $code$([ $code = 124 ] && echo ', timed out')); the end of $OUT/$stem.log:"
    tail -15 "$OUT/$stem.log" | sed 's/^/    /'
    status=1
  fi
done

if [ ${#results[@]} -gt 0 ]; then
  python3 -m mini_vllm.bench.serve combine "${results[@]}" --output "$REPORT" \
    --title "Serving on $DEVICE: $PROMPTS requests, ${IN_LEN} +- 50% in, ${OUT_LEN} +- 50% out ($MODEL)" \
    --command "bash scripts/gpu/serve_bench.sh" > /dev/null
  say "wrote $REPORT"
  sed -n '/^| configuration | rate/,/^$/p' "$REPORT"
fi
say "done in $((SECONDS - START)) s"
exit $status
