"""`bench startup`: how long an engine takes to serve its first token, cold and warm.

vLLM counterpart: the start-up lines vLLM logs (`Model loading took`, `torch.compile
takes ... in total`, `Graph capturing finished in ...`, with the compile cache under
`~/.cache/vllm/torch_compile_cache`), and its cold/warm start-up benchmark
(vllm/benchmarks/startup.py at the pinned commit, which starts the engine in fresh
processes with and without the compile cache). Here each start is a fresh process too:

- cold: empty caches (a new MINI_VLLM_CACHE for the compiled artifacts, a new
  TRITON_CACHE_DIR for the Triton kernels and their tuning results); the model has
  random weights, so no conversion is timed;
- warm: a second process on the same caches, as a server restarted on the same machine;
- both read Python bytecode written by an untimed process before them (an installed
  package has its .pyc files; a container with PYTHONDONTWRITEBYTECODE would otherwise
  recompile torch's sources at every start, about 10 s on the H100 machine measured).

Each start reports its phases: compiling (Dynamo, Inductor and the first run; at a warm
start, loading the compiled model the cold one saved, compilation/caching/aot_cache.py),
capturing the CUDA graphs (a warm-up run and a capture per graph), and, counted inside
those two, autotuning (the first launch of each Triton product kernel shape: timing its
tiles, or reading the cached pick, and compiling it); and the total to the first token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

__all__ = [
    "StartupRun",
    "format_startup_markdown",
    "fresh_start_env",
    "measure_one_start",
    "run_one_start",
    "run_startup_bench",
]

DEFAULT_WARM_STARTS = 3  # `bench startup`'s warm starts after the cold one


@dataclass
class StartupRun:
    label: str  # "cold", "warm" or "warm 1", "warm 2", ..., "warm, median"
    total_s: float  # process start (imports included) to the first token
    built_s: float  # process start to the engine built (graphs captured)
    imports_s: float  # importing mini_vllm, torch, Dynamo and Triton
    weights_s: float  # building the model and drawing its random weights
    compile_s: float  # tracing, Inductor and the first run, autotuning inside included
    autotune_s: float  # first launches of the Triton product kernels, wherever they ran
    capture_s: float  # warm-up runs and capture of every graph, autotuning inside included
    warmup_s: float  # of capture_s: the eager warm-up run before each capture
    first_token_s: float
    num_graphs: int
    num_sizes: int


def measure_one_start(model: str, device: str, compilation_mode: str, cudagraph_mode: str) -> dict:
    """Build an engine in this process and serve one token; the phases in seconds."""
    started = time.perf_counter()
    from mini_vllm import LLM, SamplingParams
    from mini_vllm import _custom_ops as ops

    imported = time.perf_counter()
    llm = LLM(
        model=model,
        device=device,
        compilation_mode=compilation_mode,
        cudagraph_mode=cudagraph_mode,
        max_num_seqs=256,  # vLLM's default: the default ladder runs up to 512
    )
    built = time.perf_counter()
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1), use_tqdm=False)
    done = time.perf_counter()
    runner = llm.engine.runner
    compile_s = runner.compile_report.seconds if runner.compile_report else 0.0
    capture = runner.capture_report
    capture_s = capture.seconds if capture else 0.0
    autotune_s = ops.autotune_seconds()
    return {
        "total_s": done - started,
        "compile_s": compile_s,
        "capture_s": capture_s,
        "warmup_s": capture.warmup_seconds if capture else 0.0,
        "autotune_s": autotune_s,
        "built_s": built - started,
        "imports_s": imported - started,
        "weights_s": llm.load_seconds,
        "first_token_s": done - built,
        "num_graphs": capture.num_graphs if capture else 0,
        "num_sizes": len(capture.sizes) if capture else 0,
    }


def run_one_start(env: dict, args: list[str], cwd: Path | None = None) -> dict:
    """One start in a fresh process (`measure_one_start` there): its phases in seconds.

    `cwd`: the folder to run in; `python -m` puts it first on sys.path, so a folder
    holding another copy of the mini_vllm package starts that copy."""
    command = [sys.executable, "-m", "mini_vllm.bench.startup", *args]
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the start-up run failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh_start_env(scratch: Path, log=print) -> dict:
    """The environment of a start on empty caches under `scratch`; Python's bytecode for
    it is written first, untimed (scripts/gpu/startup_profile.py starts the same way)."""
    env = dict(os.environ)
    env["MINI_VLLM_CACHE"] = str(scratch / "mini_vllm")
    env["TRITON_CACHE_DIR"] = str(scratch / "triton")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # under MINI_VLLM_CACHE
    # Python's own bytecode cache: an installed package has its .pyc files, but an
    # environment with PYTHONDONTWRITEBYTECODE (containers often set it) would make
    # every start compile torch's sources again, seconds that are no part of the
    # engine. Both starts read bytecode written once, before the cold one.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
    log("writing Python's bytecode cache (not timed) ...")
    imports = "import torch._dynamo, torch._inductor.compile_fx, mini_vllm.llm"
    subprocess.run([sys.executable, "-c", imports], env=env, check=True)
    return env


def run_startup_bench(
    model: str = "smollm2-135m",
    device: str = "cuda",
    compilation_mode: str = "vllm_compile",
    cudagraph_mode: str = "full_and_piecewise",
    log=print,
    warm_starts: int = DEFAULT_WARM_STARTS,
) -> list[StartupRun]:
    """A cold start, then `warm_starts` warm ones, each in a fresh process; with more than
    one warm start, a last row holds the median of each column over them."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="mini-vllm-startup-") as scratch:
        env = fresh_start_env(Path(scratch), log)
        labels = ["cold"] + (
            ["warm"] if warm_starts == 1 else [f"warm {i + 1}" for i in range(warm_starts)]
        )
        for label in labels:
            log(f"{label} start: a fresh process ...")
            got = run_one_start(env, [model, device, compilation_mode, cudagraph_mode])
            runs.append(StartupRun(label=label, **got))
            log(f"{label} start: first token after {got['total_s']:.1f} s")
    warm = runs[1:]
    if len(warm) > 1:
        runs.append(
            StartupRun(
                label="warm, median",
                **{
                    field.name: statistics.median(getattr(run, field.name) for run in warm)
                    for field in dataclasses.fields(StartupRun)
                    if field.name != "label"
                },
            )
        )
    return runs


def format_startup_markdown(
    runs: list[StartupRun], command: str, model: str, compilation_mode: str, cudagraph_mode: str
) -> str:
    import torch

    machine = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.machine()
    lines = [
        "# Start-up: from a fresh process to the first token, cold and warm",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {machine}; torch {torch.__version__}",
        f"- command: `{command}`",
        f"- engine: `{model}`, compilation `{compilation_mode}`, CUDA graphs "
        f"`{cudagraph_mode}`, vLLM's default capture sizes (max_num_seqs 256)",
        "- cold: empty compile and Triton caches; warm: later processes on the same caches, "
        "as a server restarted on the same machine; all with Python's bytecode written "
        "beforehand, as an installed package has it",
        "- warm, median: each column's median over the warm starts (a host's speed drifts "
        "by tens of percent within an hour; the medians of the columns need not add up)",
        "- compile and capture include the autotuning done inside them; autotune is that part",
        "- imports: torch, Dynamo, Triton and mini_vllm; weights: building the model and "
        "drawing its random weights",
        "- capture is an eager warm-up run and a captured run per batch size; the warm-up "
        "runs' share is the column after it",
        "",
        "<!-- ANCHOR: startup -->",
        "| start | to first token s | engine built s | imports s | weights s | compile s "
        "| capture s | of which warm-up runs s | autotune s | graphs | sizes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.label} | {run.total_s:.1f} | {run.built_s:.1f} | {run.imports_s:.1f} "
            f"| {run.weights_s:.1f} | {run.compile_s:.1f} "
            f"| {run.capture_s:.1f} | {run.warmup_s:.1f} "
            f"| {run.autotune_s:.1f} | {int(run.num_graphs)} | {int(run.num_sizes)} |"
        )
    lines.append("<!-- ANCHOR_END: startup -->")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # one start, in the child process run_startup_bench makes
    result = measure_one_start(*sys.argv[1:5])
    print(json.dumps(result))
