#!/usr/bin/env python3
"""Where each step of the nano-vllm offline workload spends its time: the host's parts
step by step, the GPU's kernel time over windows of steps, and cProfile over one window.

    python3 scripts/gpu/workload_timeline.py [--model smollm2-135m] [--num-prompts 256]
        [--engine-option async_scheduling=true] [--out DIR]

The workload is throughput_workload.py's (same draw, same engine settings), served
through `llm.engine.step()` so that every step can be timed: the scheduler's planning
(`Scheduler.schedule`), the runner (`ModelRunner.execute_model`: inputs, forward,
sampling, and, in a synchronous step, the wait for the GPU), taking in the tokens
(`Scheduler.update_from_output`), and the rest of `LLMEngine.step`. Then the run is
repeated twice more, once with torch.profiler recording the GPU's kernels over two
windows of steps (the prefill-heavy start and a stretch of plain decode steps with
every request running) and once with cProfile over the decode window. The ratio of
kernel time to wall time in a window is how busy the GPU was: far below 1, the host
is what the step waits for.

Writes workload_timeline.txt (the tables) and workload_timeline-<model>.csv (one line a
step, for a plot) into the output folder.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import pstats
import statistics
import sys
import time

from gpukit import run_script
from throughput_workload import TEMPERATURE, draw_workload, engine_option

PHASES = ("schedule", "execute", "update", "other")


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="(default: %(default)s)")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a dry run
    parser.add_argument("--num-prompts", type=int, default=256, help="(default: %(default)s)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="(default: %(default)s)")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=16384, help="(default: %(default)s)"
    )
    parser.add_argument(
        "--window", type=int, default=40, help="steps in each profiled window (default: 40)"
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another engine option for LLM(...), repeatable",
    )


class PhaseTimer:
    """Wraps the engine's step parts and keeps each part's time of the current step."""

    def __init__(self, engine) -> None:
        self.seconds = dict.fromkeys(PHASES[:-1], 0.0)
        scheduler, runner = engine.scheduler, engine.runner
        scheduler.schedule = self._timed("schedule", scheduler.schedule)
        scheduler.update_from_output = self._timed("update", scheduler.update_from_output)
        runner.execute_model = self._timed("execute", runner.execute_model)

    def _timed(self, name, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed

    def take(self) -> dict[str, float]:
        taken = dict(self.seconds)
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return taken


def serve(llm, prompts, output_lens, on_step=None) -> float:
    """Add every request, step until all finish; `on_step(index)` before each step."""
    from mini_vllm import SamplingParams

    engine = llm.engine
    for prompt, n in zip(prompts, output_lens):
        engine.add_request(
            prompt, SamplingParams(temperature=TEMPERATURE, max_tokens=n, ignore_eos=True)
        )
    start = time.perf_counter()
    index = 0
    while engine.has_unfinished_requests():
        if on_step is not None:
            on_step(index)
        engine.step()
        index += 1
    return time.perf_counter() - start


def kind_of(record) -> str:
    if record.num_prefill_tokens == 0:
        return "decode"
    return "mixed" if record.num_decode_tokens else "prefill"


def measure(args, report) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mini_vllm import LLM

    on_cuda = args.device == "cuda"

    def synchronize() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    options = dict(engine_option(text) for text in args.engine_option)
    llm = LLM(
        args.model,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else None,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=2048,
        **options,
    )
    engine = llm.engine
    prompts, output_lens = draw_workload(args.num_prompts, (100, 1024), (100, 1024), 0)
    serve(llm, [p[:32] for p in prompts[:4]], [8] * 4)  # warm-up

    # 1. Every step's parts.
    timer = PhaseTimer(engine)
    rows: list[dict] = []
    step_start = [0.0]

    def close_step(index: int) -> None:
        now = time.perf_counter()
        if index > 0:
            parts = timer.take()
            total = now - step_start[0]
            parts["other"] = total - sum(parts.values())
            record = engine.runner.last_step
            rows.append(
                {
                    "step": index - 1,
                    "kind": kind_of(record),
                    "rows": record.num_reqs,
                    "tokens": record.num_tokens,
                    "padded": record.num_padded_tokens,
                    "mode": record.runtime_mode,
                    "total_ms": 1e3 * total,
                    **{f"{name}_ms": 1e3 * value for name, value in parts.items()},
                }
            )
        step_start[0] = now

    steps_before = engine.stats.num_steps
    wall = serve(llm, prompts, output_lens, close_step)
    close_step(len(rows) + 1)
    synchronize()
    steps = engine.stats.num_steps - steps_before
    report(f"model {args.model}, engine options {options or 'none'}")
    report(
        f"{len(prompts)} requests, {sum(output_lens)} output tokens, {steps} steps in "
        f"{wall:.2f} s: {sum(output_lens) / wall:,.1f} output tokens/s, "
        f"{1e3 * wall / steps:.2f} ms a step"
    )
    report()
    report("| steps | count | rows (median) | tokens (median) | step ms | " + " | ".join(
        f"{p} ms" for p in PHASES) + " | share of the run |")  # fmt: skip
    report("|---|---|---|---|---|" + "---|" * len(PHASES) + "---|")
    for kind in ("prefill", "mixed", "decode"):
        group = [r for r in rows if r["kind"] == kind]
        if not group:
            continue
        med = {k: statistics.median(r[k] for r in group) for k in group[0] if k.endswith("ms")}
        share = sum(r["total_ms"] for r in group) / (1e3 * wall)
        report(
            f"| {kind} | {len(group)} | {statistics.median(r['rows'] for r in group):.0f} | "
            f"{statistics.median(r['tokens'] for r in group):.0f} | {med['total_ms']:.2f} | "
            + " | ".join(f"{med[p + '_ms']:.2f}" for p in PHASES)
            + f" | {share:.0%} |"
        )
    path = args.out / f"workload_timeline-{args.model}.csv"
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    report(f"\n(one line a step: {path.name})")

    # 2. GPU kernel time over two windows: the first steps, and decode steps at full batch.
    # The decode window starts where every request runs, after the first window ends.
    full_batch = max(r["rows"] for r in rows)
    decode_start = next(
        (
            r["step"]
            for r in rows
            if r["kind"] == "decode" and r["rows"] == full_batch and r["step"] > args.window
        ),
        len(rows) // 3,
    )
    windows = {"start": 0, "decode at full batch": decode_start + 5}
    traces: dict[str, tuple[float, object]] = {}
    active: dict = {}

    def trace_windows(index: int) -> None:
        for name, first in windows.items():
            if index == first:
                synchronize()
                activities = [ProfilerActivity.CUDA if on_cuda else ProfilerActivity.CPU]
                active[name] = (profile(activities=activities), time.perf_counter())
                active[name][0].__enter__()
            elif index == first + args.window and name in active:
                synchronize()
                trace, began = active.pop(name)
                trace.__exit__(None, None, None)
                traces[name] = (time.perf_counter() - began, trace)

    serve(llm, prompts, output_lens, trace_windows)
    report(f"\n## GPU kernel time over {args.window} steps\n")
    report("| window | first step | wall ms | kernel ms | GPU busy |")
    report("|---|---|---|---|---|")
    for name, (seconds, trace) in traces.items():
        kernel_us = sum(
            e.self_device_time_total for e in trace.key_averages() if e.self_device_time_total
        )
        report(
            f"| {name} | {windows[name]} | {1e3 * seconds:.1f} | {kernel_us / 1e3:.1f} | "
            f"{kernel_us / 1e3 / (1e3 * seconds):.0%} |"
        )
    for name, (_, trace) in traces.items():
        report(f"\n### kernels, window '{name}'\n")
        report("```")
        report(
            trace.key_averages().table(
                sort_by="self_device_time_total", row_limit=15, max_name_column_width=60
            )
        )
        report("```")

    # 3. cProfile over the decode window.
    profiler = cProfile.Profile()
    first = windows["decode at full batch"]

    def profile_window(index: int) -> None:
        if index == first:
            profiler.enable()
        elif index == first + args.window:
            profiler.disable()

    serve(llm, prompts, output_lens, profile_window)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    report(f"\n## cProfile over {args.window} decode steps from step {first}, by own time\n")
    report("```")
    report(text.getvalue())
    report("```")


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
