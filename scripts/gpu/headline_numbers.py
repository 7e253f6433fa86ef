#!/usr/bin/env python3
"""The headline numbers of one model shape, from repeated runs in fresh processes.

    python3 scripts/gpu/headline_numbers.py [--model smollm2-135m] [--rounds 5]
        [--modes torch-only+eager,torch-only+full,eager,compile+full,compile+full+async]
        [--batch-sizes 1,2,4,8,16,32,64] [--write benchmarks/results/headline-smollm2-135m.md]

Each round runs every configuration (an engine mode of mini_vllm/bench/harness.py) once, in
a fresh process of its own, the configurations taking turns (in reverse order every other
round), so that a host that is busier for a while slows them all alike. A process builds
the engine as `python -m mini_vllm bench decode` does and times each batch size with its
`measure_batch` (mini_vllm/bench/decode_graphs.py: the median of --steps decode steps, the
forward alone on as many more, the kernels of one step with their GPU time); in a FULL-graph
configuration it also replays the batch-1 graph back to back and times it with CUDA events
(`time_graph_replay` of scripts/gpu/factcheck_parts.py). The report gives every process's
batch-1 numbers as they come, then the headline file: each number the median over the
rounds, with the lowest and highest (scripts/figures/headline.py `summarise_runs`).

With --write, the file is written there: the keys measured here replace the file's; the keys
it has and this run does not measure (a transformers baseline, a compile time) are kept with
their own sources, and so are its tables of other runs and of what the simulator presets
are fitted to. Then run `pytest tests/course/test_headline_numbers.py`: it names every place
in the course that still quotes an old value. With --runs FILE each process's results are
also appended to FILE, and the runs already there with the same settings count too: a
long measurement can be split over several commands (`--rounds 2` three times).

Time: a SmolLM2-135M process takes 10 to 40 s (the compiled ones compile first; the
Inductor cache makes the later rounds faster), so five rounds of five configurations take
10 to 15 minutes; the Llama-3.1-8B shape several times that. `--rounds 3` and fewer batch
sizes shorten it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

from gpukit import ROOT, run_script

# The headline files' reader and writer live with the figures that read them.
sys.path.insert(0, str(ROOT / "scripts" / "figures"))

SCRIPT = Path(__file__).resolve()
CONTEXT_LEN = 128
GRAPH_REPLAYS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from headline import DEFAULT_MODES

    parser.add_argument(
        "--model", default="smollm2-135m", help="a model shape (default: %(default)s)"
    )
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help="engine modes, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-sizes", default="1,2,4,8,16,32,64", help="default: %(default)s (1 is needed)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="processes of each configuration")
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps a batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed decode steps before them")
    parser.add_argument(
        "--write",
        type=Path,
        help="the headline file to write (e.g. benchmarks/results/headline-smollm2-135m.md)",
    )
    parser.add_argument(
        "--runs",
        type=Path,
        help="a JSON-lines file each process's results are appended to; the runs already "
        "in it (same model, batch sizes and steps) count too, so rounds can be split over "
        "several commands",
    )


# --- One process: one configuration, every batch size ------------------------------------


def one_process(argv: list[str]) -> int:
    """`headline_numbers.py one-process MODE ...`: measure one configuration in this
    process and print its results as one line of JSON (what the rounds start)."""
    parser = argparse.ArgumentParser(prog=f"{SCRIPT.name} one-process")
    parser.add_argument("mode")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-sizes", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    args = parser.parse_args(argv)

    import torch
    from factcheck_parts import time_graph_replay

    from mini_vllm.bench.decode_graphs import measure_batch, new_tokens_per_request
    from mini_vllm.bench.harness import decode_engine
    from mini_vllm.models.loader import load_model

    device = torch.device("cuda")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    # bfloat16, as `bench decode` runs a model on a GPU ("auto")
    model, _, _ = load_model(args.model, device=device, dtype="auto", progress=False)
    new_tokens = new_tokens_per_request(args.steps, args.warmup)
    engine = decode_engine(model, args.mode, batches, CONTEXT_LEN, new_tokens)
    results = {
        str(b): dataclasses.asdict(
            measure_batch(engine, b, CONTEXT_LEN, args.steps, args.warmup, device)
        )
        for b in batches
    }
    replay = None
    if "full" in args.mode and 1 in batches:
        replay = time_graph_replay(engine, 1, GRAPH_REPLAYS, device)
    print(json.dumps({"mode": args.mode, "batches": results, "replay_gpu_ms": replay}))
    return 0


def _run_one(args: argparse.Namespace, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, str(SCRIPT), "one-process", mode, "--model", args.model]
    command += ["--batch-sizes", args.batch_sizes, "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- The rounds, and the file ------------------------------------------------------------


def _each_run_row(round_: int, mode: str, run: dict) -> dict[str, str]:
    one = run["batches"]["1"]
    return {
        "round": str(round_),
        "configuration": mode,
        "step ms": f"{one['step_ms']:.3f}",
        "fwd ms": f"{one['forward_ms']:.3f}",
        "kernels": str(one["kernels"]),
        "kernels' GPU ms": f"{one['kernel_ms']:.3f}" if one["kernel_ms"] is not None else "-",
        "graph replay GPU ms": f"{run['replay_gpu_ms']:.3f}" if run["replay_gpu_ms"] else "-",
    }


def measure(args: argparse.Namespace, report) -> None:
    import torch
    from headline import (
        format_headline_file,
        kept_sections,
        merge_headlines,
        read_headlines,
        summarise_runs,
    )

    from mini_vllm.bench.harness import check_modes

    modes = args.modes.split(",")
    check_modes(modes)
    if "1" not in args.batch_sizes.split(","):
        raise SystemExit("--batch-sizes must include 1: the headline numbers are at batch 1")
    same = {"model": args.model, "batch_sizes": args.batch_sizes, "steps": args.steps}
    earlier = []
    if args.runs and args.runs.is_file():
        lines = args.runs.read_text(encoding="utf-8").splitlines()
        earlier = [json.loads(line) for line in lines if line.strip()]
        earlier = [r for r in earlier if all(r.get(k) == v for k, v in same.items())]
        report(f"{len(earlier)} earlier runs of the same settings in {args.runs}")
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    each_run = []

    def record(round_: int, mode: str, run: dict) -> dict[str, str]:
        runs[mode].append(run)
        row = _each_run_row(round_, mode, run)
        each_run.append(row)
        return row

    for run in earlier:
        if run["mode"] in runs:
            record(run["round"], run["mode"], run)
    first = max((r["round"] for r in earlier), default=0) + 1
    for round_ in range(first, first + args.rounds):
        for mode in modes if round_ % 2 else modes[::-1]:
            run = {**_run_one(args, mode), "round": round_, **same}
            if args.runs:
                with open(args.runs, "a", encoding="utf-8") as file:
                    file.write(json.dumps(run) + "\n")
            row = record(round_, mode, run)
            report(
                f"round {round_} {mode}: batch 1 step {row['step ms']} ms, forward "
                f"{row['fwd ms']} ms, {row['kernels']} kernels, graph replay "
                f"{row['graph replay GPU ms']} ms"
            )
    headlines, by_batch = summarise_runs(runs)
    rounds = len({row["round"] for row in each_run})
    command = "python3 scripts/gpu/headline_numbers.py " + " ".join(sys.argv[1:])
    header = [
        f"- machine: {torch.cuda.get_device_name()}; torch {torch.__version__}",
        f"- date: {date.today().isoformat()}",
        f"- command: `{command.strip()}`",
        f"- runs: {rounds} rounds; in each, one fresh process per configuration, the "
        "configurations taking turns (in reverse order every other round); value = the "
        "median over the processes, spread = the lowest and the highest",
        f"- each process: `{args.model}` with random weights, bfloat16, context "
        f"{CONTEXT_LEN} tokens; a step is the median of {args.steps} decode steps after "
        f"{args.warmup} warm-up steps, timed as `python -m mini_vllm bench decode` times "
        "them (mini_vllm/bench/decode_graphs.py `measure_batch`)",
        f"- configurations: {', '.join(modes)} (mini_vllm/bench/harness.py `MODES`)",
    ]
    old, kept = {}, ""
    if args.write and args.write.is_file():
        old = read_headlines(args.write)
        kept = kept_sections(args.write.read_text(encoding="utf-8"))
    text = format_headline_file(
        args.model, header, merge_headlines(headlines, old), by_batch, each_run, kept
    )
    report("")
    report(text)
    if args.write:
        args.write.write_text(text, encoding="utf-8")
        report(f"wrote {args.write}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "one-process":
        sys.exit(one_process(sys.argv[2:]))
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
