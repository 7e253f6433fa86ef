#!/usr/bin/env bash
# Decode step time of two versions of mini_vllm on one GPU, alternating: the checkout's
# package against another copy of it (OLD, a folder holding a mini_vllm/ package, e.g.
# made with `git worktree add /tmp/old <commit>` and copied), same modes, same host.
#
#     bash scripts/gpu/ab_decode.sh OLD [OUT] [MODES] [ROUNDS]
#
# Writes OUT/ab-decode.log (default out/gpu) with every run's table rows, tagged old/new.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD="${1:?the folder holding the other mini_vllm package}"
OUT="${2:-out/gpu}"
MODES="${3:-eager,full,compile+full+async}"
ROUNDS="${4:-2}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    path=$([ "$side" = old ] && echo "$OLD" || echo .)
    PYTHONPATH="$path" python3 -m mini_vllm bench decode --device cuda --batch-sizes 1,8 \
      --modes "$MODES" --no-output 2>&1 | grep -E "^\| (1|8) " | sed "s/^/$side round $round /" \
      | tee -a "$OUT/ab-decode.log"
  done
done
