#!/usr/bin/env bash
# Decode step time of two versions of mini_vllm on one GPU, alternating: the checkout's
# package against another copy of it (OLD, a folder holding a mini_vllm/ package, e.g.
# made with `git worktree add /tmp/old <commit>` and copied), same modes, same host.
#
#     bash scripts/gpu/ab_decode.sh OLD [OUT] [MODES] [ROUNDS]
#     MODEL=llama-3.2-1b-like BATCHES=1,8,32 bash scripts/gpu/ab_decode.sh OLD ...
#
# Writes OUT/ab-decode.log (default out/gpu) with every run's table rows, tagged old/new.
# MODEL (default smollm2-135m) and BATCHES (default 1,8) choose the shape and batch sizes.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD="${1:?the folder holding the other mini_vllm package}"
OUT="$(realpath -m "${2:-out/gpu}")"
OLD="$(realpath "$OLD")"
MODES="${3:-eager,full,compile+full+async}"
ROUNDS="${4:-2}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    # Run from the folder that holds the package: `python -m` puts the working directory
    # ahead of PYTHONPATH on sys.path, so a PYTHONPATH alone would run the checkout twice.
    path=$([ "$side" = old ] && echo "$OLD" || echo .)
    (cd "$path" && python3 -m mini_vllm bench decode --device cuda \
      --model "${MODEL:-smollm2-135m}" --batch-sizes "${BATCHES:-1,8}" --modes "$MODES" \
      --no-output 2>&1 | grep -E "^\| ([0-9]+|batch) \|" \
      | sed "s/^/${MODEL:-smollm2-135m} $side round $round /" | tee -a "$OUT/ab-decode.log")
  done
done
