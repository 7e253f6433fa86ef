#!/usr/bin/env python3
"""One mixed step — 16 requests decoding while a 512-token prompt arrives — timed on the GPU,
for this checkout and, optionally, another copy of mini_vllm side by side.

    python3 scripts/gpu/mixed_step.py [OLD] [--models smollm2-135m] [--repeats 20] [--out DIR]

OLD is a folder holding another copy of the mini_vllm package (e.g. made with
`git archive <commit> mini_vllm | tar -x -C OLD`). Each version and setting runs in a fresh
process: an engine (bfloat16, max_num_seqs 256, max_num_batched_tokens 2048) with 16
requests of 256-token prompts decoding; then, `--repeats` times, a 512-token prompt that
asks for one token joins them, so the next step computes the 16 decodes and the whole
prompt together (528 tokens), and the step after it is a plain decode step. Both steps are
timed from the host, the GPU synchronised before and after, and the report gives the
medians with the step's graph mode and padded size from the engine's step record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpukit import ROOT, run_script

# Run in the version's folder (`python -c` puts it first on sys.path). It uses only what
# older copies of the package have too: LLM, SamplingParams, the engine's step record.
CHILD = """
import json, statistics, sys, time, torch
from mini_vllm import LLM, SamplingParams
model, setting = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model, device="cuda", dtype="bfloat16", max_num_seqs=256,
          max_num_batched_tokens=2048, max_model_len=2048, **setting)
engine = llm.engine
decode = SamplingParams(temperature=0, max_tokens=1800, ignore_eos=True)
for i in range(16):
    engine.add_request([3 + (7 * i + j) % 200 for j in range(256)], decode)
for _ in range(6):  # the 16 prompts in, decoding under way
    engine.step()

def timed_step():
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.step()
    torch.cuda.synchronize()
    return time.perf_counter() - start, engine.runner.last_step

one_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
mixed, plain, record = [], [], None
profile_path = sys.argv[4] if len(sys.argv) > 4 else ""
if profile_path:
    import cProfile, pstats
    profiler = cProfile.Profile()
for repeat in range(3 + int(sys.argv[3])):
    engine.add_request([5 + (3 * repeat + j) % 200 for j in range(512)], one_token)
    if profile_path and repeat >= 3:
        profiler.enable()
    seconds, record = timed_step()
    if profile_path:
        profiler.disable()
    if (record.num_prefill_tokens, record.num_decode_tokens) != (512, 16):
        raise SystemExit(f"the step was not 16 decodes and a 512-token prefill: {record}")
    decode_seconds, decode_record = timed_step()
    if repeat >= 3:  # the first three warm up
        mixed.append(seconds)
        plain.append(decode_seconds)
if profile_path:
    with open(profile_path, "w") as file:
        pstats.Stats(profiler, stream=file).sort_stats("tottime").print_stats(40)
        pstats.Stats(profiler, stream=file).sort_stats("cumulative").print_stats(40)
    from torch.profiler import ProfilerActivity, profile
    engine.add_request([7 + j % 200 for j in range(512)], one_token)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        timed_step()
    with open(profile_path, "a") as file:
        file.write(trace.key_averages().table(sort_by="cuda_time_total", row_limit=30))
        file.write(trace.key_averages().table(sort_by="cpu_time_total", row_limit=30))
print(json.dumps({
    "mixed_ms": 1e3 * statistics.median(mixed),
    "mixed_min_ms": 1e3 * min(mixed),
    "mixed_mode": record.runtime_mode,
    "mixed_padded": record.num_padded_tokens,
    "decode_ms": 1e3 * statistics.median(plain),
    "decode_mode": decode_record.runtime_mode,
}))
"""

SETTINGS = {
    "default": {},
    "torch-only": {"custom_ops": "none"},
    "vllm-compile": {"compilation_mode": "vllm_compile"},
    # vLLM's ladder continued by 16s to 1024, so that the 528-token step has a graph.
    "ladder-1024": {"cudagraph_capture_sizes": [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]},
}


def add_arguments(parser) -> None:
    parser.add_argument(
        "old", type=Path, nargs="?", help="folder holding another mini_vllm package to compare"
    )
    parser.add_argument(
        "--this",
        type=Path,
        default=ROOT,
        help="folder holding the package to measure (default: this checkout)",
    )
    parser.add_argument("--models", default="smollm2-135m", help="comma-separated model names")
    parser.add_argument("--repeats", type=int, default=20, help="timed mixed steps per run")
    parser.add_argument(
        "--settings",
        default="default,torch-only,vllm-compile",
        help=f"comma-separated, of {', '.join(SETTINGS)} (the other copy runs 'default' only)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write, per run, cProfile's view of the timed mixed steps and torch.profiler's "
        "of one more (mixed_step-<model>-<version>-<setting>.prof.txt in the output folder)",
    )


def run_child(
    folder: Path, model: str, setting: dict, repeats: int, profile: Path | None = None
) -> dict | str:
    env = dict(os.environ, PYTHONPATH=str(folder))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model, json.dumps(setting), str(repeats)]
        + ([str(profile)] if profile is not None else []),
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args, report) -> None:
    this = args.this.resolve()
    runs = [(f"this ({this.name})", this, name) for name in args.settings.split(",")]
    if args.old is not None:
        runs.insert(0, (f"other copy ({args.old.name})", args.old.resolve(), "default"))
    report("| model | version | setting | mixed step ms (median, min) | mode, padded to "
           "| decode step ms | mode |")  # fmt: skip
    report("|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for version, folder, name in runs:
            profile = None
            if args.profile:
                profile = args.out / f"mixed_step-{model}-{folder.name}-{name}.prof.txt"
            result = run_child(folder, model, SETTINGS[name], args.repeats, profile)
            if isinstance(result, str):
                report(f"| {model} | {version} | {name} | {result} | | | |")
                continue
            report(
                f"| {model} | {version} | {name} | {result['mixed_ms']:.2f} "
                f"({result['mixed_min_ms']:.2f}) | {result['mixed_mode']}, "
                f"{result['mixed_padded']} | {result['decode_ms']:.2f} | {result['decode_mode']} |"
            )


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
