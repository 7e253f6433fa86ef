#!/usr/bin/env bash
# Start-up of two versions of mini_vllm on one GPU, alternating: the checkout's package
# against another copy of it (OLD, a folder holding a mini_vllm/ package), each a cold and
# a warm start in fresh processes (`python -m mini_vllm bench startup`), same host.
#
#     bash scripts/gpu/ab_startup.sh OLD [OUT] [ROUNDS]
#
# Writes OUT/ab-startup.log (default out/gpu) with every run's table rows, tagged old/new.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD="$(realpath "${1:?the folder holding the other mini_vllm package}")"
OUT="$(realpath -m "${2:-out/gpu}")"
ROUNDS="${3:-2}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in $(seq "$ROUNDS"); do
  for side in new old; do
    # Run from the folder that holds the package (see ab_decode.sh).
    path=$([ "$side" = old ] && echo "$OLD" || echo .)
    (cd "$path" && python3 -m mini_vllm bench startup --device cuda --no-output 2>&1 \
      | grep -E "^\| (start|cold|warm) \|" | sed "s/^/$side round $round /" \
      | tee -a "$OUT/ab-startup.log")
  done
done
