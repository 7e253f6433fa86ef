#!/usr/bin/env python3
"""The eager decode step of two versions of mini_vllm on one GPU, alternating.

    python3 scripts/gpu/ab_eager.py OLD [--models smollm2-135m,llama-3.1-8b-like]
        [--rounds 3] [--out DIR]

OLD is a folder holding another copy of the mini_vllm package (e.g. made with
`git archive <commit> mini_vllm | tar -x -C OLD`). Each round runs each version in a
fresh process: an eager engine at batch 1 (context 128, bfloat16), 30 untimed decode
steps, then 25 windows of 20 steps, each window timed on its own. The eager step is
almost all host time, and a shared host's other work only ever adds to it, so the
report gives each process's fastest window next to its median, and the medians of
both over the rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gpukit import old_package_argument, run_script, versions_to_compare

# Run in the version's folder (`python -c` puts it first on sys.path).
CHILD = """
import json, sys, time, torch
from mini_vllm.bench.harness import decode_engine, start_decoding
from mini_vllm.models.loader import load_model
model, _, _ = load_model(sys.argv[1], device="cuda", dtype="auto", progress=False)
engine = decode_engine(model, "eager", [1], context_len=128, new_tokens=600)
start_decoding(engine, batch=1, context_len=128, new_tokens=600)
for _ in range(30):
    engine.step()
windows = []
for _ in range(25):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        engine.step()
    torch.cuda.synchronize()
    windows.append((time.perf_counter() - start) / 20 * 1e3)
print(json.dumps(windows))
"""


def add_arguments(parser) -> None:
    old_package_argument(parser)
    parser.add_argument("--models", default="smollm2-135m,llama-3.1-8b-like")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each version")


def _windows(folder: Path, model: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the eager run in {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args, report) -> None:
    versions = versions_to_compare(args.old, "ab_eager.py")
    rows = []
    for model in args.models.split(","):
        fastest: dict[str, list[float]] = {name: [] for name in versions}
        medians: dict[str, list[float]] = {name: [] for name in versions}
        for round_ in range(1, args.rounds + 1):
            for name, folder in versions.items():
                windows = _windows(folder, model)
                fastest[name].append(min(windows))
                medians[name].append(statistics.median(windows))
                report(
                    f"{model} round {round_} {name}: eager step ms, fastest window "
                    f"{min(windows):.3f}, median window {statistics.median(windows):.3f}"
                )
        for name in versions:
            rows.append(
                f"| {model} | {name} | {' / '.join(f'{v:.3f}' for v in fastest[name])} "
                f"| {statistics.median(fastest[name]):.3f} "
                f"| {statistics.median(medians[name]):.3f} |"
            )
    report("")
    report(
        "| shape | version | fastest window of each process, ms | median of those, ms "
        "| median of the median windows, ms |"
    )
    report("|---|---|---|---|---|")
    for row in rows:
        report(row)


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
