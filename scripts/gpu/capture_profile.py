#!/usr/bin/env python3
"""Where a warm restart's capture time goes: each warm-up run and each graph's capture.

    python3 scripts/gpu/capture_profile.py [--model smollm2-135m]
        [--cudagraph-mode full_and_piecewise] [--out DIR]

Fills the caches with a cold start in a fresh process (as `python -m mini_vllm bench
startup` does), then starts twice more on them, each a fresh process:

- once with timers: for each capture key, the warm-up run's host time and the wait for
  its GPU work; for each graph, the capture split into its start (a synchronisation and
  `capture_begin`), the recorded call, and its end (`capture_end`, which instantiates
  the graph). Printed per key and summed by kind of key;
- once under py-spy, where it is installed (`pip install py-spy`), from the imports to
  the first token: each function's own and inclusive share of the samples, over the
  whole start and over the capture alone. (scripts/gpu/startup_profile.py gives
  cProfile's view of a start; its attribution is skewed where Dynamo swaps Python's
  frame evaluation, which a sampling profiler does not mind.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpukit import ROOT, run_script


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--compilation-mode", default="vllm_compile")
    parser.add_argument("--cudagraph-mode", default="full_and_piecewise")
    parser.add_argument("--rows", type=int, default=40, help="rows of each profile table")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument(
        "--native", action="store_true", help="py-spy also samples C and C++ frames"
    )


def _install_timers(records: dict) -> None:
    """Wrap the CUDA graph backend's warm-up, synchronisation and capture with timers."""
    import torch

    from mini_vllm.compilation.graph_backend import CUDAGraphBackend
    from mini_vllm.engine.model_runner import ModelRunner

    capture_model = ModelRunner.capture_model
    warmup_context, synchronize = CUDAGraphBackend.warmup_context, CUDAGraphBackend.synchronize
    pending: dict[str, float] = {}

    @contextlib.contextmanager
    def timed_warmup_context(self):
        pending["start"] = time.perf_counter()
        with warmup_context(self):
            yield
        pending["host_end"] = time.perf_counter()

    def timed_synchronize(self):
        synchronize(self)
        if "host_end" in pending:  # the synchronisation right after a warm-up run
            start, host_end = pending.pop("start"), pending.pop("host_end")
            records["warmups"].append([host_end - start, time.perf_counter() - host_end])

    def timed_capture(self, runnable, args, kwargs, pool):
        graph = torch.cuda.CUDAGraph()
        context = torch.cuda.graph(graph, pool=pool)
        t0 = time.perf_counter()
        context.__enter__()
        t1 = time.perf_counter()
        try:
            output = runnable(*args, **kwargs)
        finally:
            t2 = time.perf_counter()
            context.__exit__(None, None, None)
        t3 = time.perf_counter()
        records["captures"].append([len(records["warmups"]) - 1, t1 - t0, t2 - t1, t3 - t2])
        return graph, output

    def labelled_capture_model(self, *args, **kwargs):
        keys = self.dispatcher.all_keys()
        records["keys"] = [
            f"{mode.name} {d.num_tokens}{' uniform' if d.uniform else ''}" for mode, d in keys
        ]
        return capture_model(self, *args, **kwargs)

    ModelRunner.capture_model = labelled_capture_model
    CUDAGraphBackend.warmup_context = timed_warmup_context
    CUDAGraphBackend.synchronize = timed_synchronize
    CUDAGraphBackend.capture = timed_capture


def child(result_path: str, start_args: list[str]) -> None:
    """One start in this process with the timers on: the records go to `result_path`,
    the phases to stdout as every start prints them."""
    from mini_vllm.bench.startup import measure_one_start

    records: dict = {"warmups": [], "captures": []}
    _install_timers(records)
    phases = measure_one_start(*start_args)
    Path(result_path).write_text(json.dumps(records))
    print(json.dumps(phases))


def _summarise(records: dict, report) -> None:
    warmups, captures, keys = records["warmups"], records["captures"], records["keys"]
    by_key: dict[int, list] = {}
    for index, begin, call, end in captures:
        by_key.setdefault(index, []).append((begin, call, end))
    report("per key: warm-up host ms, warm-up GPU wait ms, graphs, capture start / call / end ms")
    totals: dict[str, list[float]] = {}
    for index, (host, wait) in enumerate(warmups):
        graphs = by_key.get(index, [])
        begin = sum(g[0] for g in graphs) * 1e3
        call = sum(g[1] for g in graphs) * 1e3
        end = sum(g[2] for g in graphs) * 1e3
        key = keys[index] if index < len(keys) else f"key {index}"
        kind = key.split()[0]
        row = totals.setdefault(kind, [0, 0.0, 0.0, 0, 0.0, 0.0, 0.0])
        for i, value in enumerate((1, host * 1e3, wait * 1e3, len(graphs), begin, call, end)):
            row[i] += value
        report(
            f"  {key:<28} {host * 1e3:7.1f} {wait * 1e3:6.1f}  {len(graphs):3d}  "
            f"{begin:6.1f} / {call:6.1f} / {end:6.1f}"
        )
    report("")
    report("by kind: keys, warm-up host s, warm-up wait s, graphs, capture start / call / end s")
    for kind, (n, host, wait, graphs, begin, call, end) in totals.items():
        report(
            f"  {kind:<10} {n:3d} keys  {host / 1e3:6.2f} {wait / 1e3:6.2f}  {graphs:5d} graphs  "
            f"{begin / 1e3:6.2f} / {call / 1e3:6.2f} / {end / 1e3:6.2f}"
        )
    if warmups:
        first_host = warmups[0][0] * 1e3
        rest = sorted(w[0] * 1e3 for w in warmups[1:])
        if rest:
            report(
                f"warm-up host ms: first {first_host:.1f}; the others median "
                f"{rest[len(rest) // 2]:.1f}, min {rest[0]:.1f}, max {rest[-1]:.1f}"
            )


def measure(args, report) -> None:
    from mini_vllm.bench.startup import fresh_start_env

    start_args = [args.model, "cuda", args.compilation_mode, args.cudagraph_mode]
    with tempfile.TemporaryDirectory(prefix="mini-vllm-capture-profile-") as scratch:
        env = fresh_start_env(Path(scratch), report)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        plain = [sys.executable, "-m", "mini_vllm.bench.startup", *start_args]
        timers_file = Path(scratch) / "timers.json"
        py_spy = shutil.which("py-spy")
        profile_file = Path(scratch) / "start.stacks"
        sampled = [
            str(py_spy), "record", "--format", "raw", "--rate", str(args.rate),
            "--output", str(profile_file), *(["--native"] if args.native else []),
            "--", *plain,
        ]  # fmt: skip
        timed = [sys.executable, str(Path(__file__).resolve()), "--child", str(timers_file)]
        timed += start_args
        runs = [
            ("cold (fills the caches)", plain),
            ("warm, with timers", timed),
            *([("warm, under py-spy", sampled)] if py_spy else []),
        ]
        for label, command in runs:
            t0 = time.perf_counter()
            done = subprocess.run(
                command, env=env, cwd=scratch, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"the {label} start failed:\n{done.stderr[-4000:]}")
            phases = json.loads(_last_json_line(done.stdout))
            report(f"{label} ({time.perf_counter() - t0:.1f} s wall): " + ", ".join(
                f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                for key, value in phases.items()
            ))  # fmt: skip
        report("")
        records = json.loads(timers_file.read_text())
        _summarise(records, report)
        report("")
        if not py_spy:
            report("py-spy is not installed here: no sampled profile (pip install py-spy)")
            return
        stacks = _read_stacks(profile_file)
        for title, within in (
            ("the whole start", None),
            ("the capture", "ModelRunner.capture_model"),
        ):
            _report_stacks(stacks, within, args.rows, args.rate, title, report)


def _last_json_line(stdout: str) -> str:
    return next(line for line in reversed(stdout.splitlines()) if line.startswith("{"))


_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*?)(?::\d+)?\)$")


def _read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) stacks: `frame;frame;... count`, outermost first. Frames
    are named `function (file)`, the line dropped, so one function is one name."""
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        names = []
        for frame in frames.split(";"):
            match = _FRAME.match(frame)
            if match:
                file = match["file"]
                file = file.split("site-packages/")[-1] if "site-packages/" in file else file
                names.append(f"{match['function']} ({file.replace(str(ROOT) + '/', '')})")
            else:
                names.append(frame)
        stacks.append((names, int(count)))
    return stacks


def _report_stacks(stacks, within, rows: int, rate: int, title: str, report) -> None:
    """Each function's own samples and inclusive samples (counted once a stack), as
    seconds; `within` keeps only stacks passing through a function of that name."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for names, count in stacks:
        if within is not None:
            starts = [i for i, name in enumerate(names) if name.split(" (")[0].endswith(within)]
            if not starts:
                continue
            names = names[starts[0] :]
        total += count
        own[names[-1]] = own.get(names[-1], 0) + count
        for name in set(names):
            inclusive[name] = inclusive.get(name, 0) + count
    report(f"py-spy, {title}: {total} samples ({total / rate:.1f} s)")
    for label, table in (("own", own), ("inclusive", inclusive)):
        report(f"  by {label} time:")
        for name, count in sorted(table.items(), key=lambda item: -item[1])[:rows]:
            report(f"    {count / rate:7.2f} s  {100 * count / max(total, 1):5.1f}%  {name}")
    report("")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:7])
        sys.exit(0)
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
