#!/usr/bin/env python3
"""The nano-vllm offline workload through `mini_vllm.LLM`, one model shape after another.

    python3 scripts/gpu/throughput_workload.py [--models smollm2-135m,llama-3.2-1b-like]
        [--out out/gpu/throughput_workload.md] [--profile 32]
    PYTHONPATH=OLD python3 scripts/gpu/throughput_workload.py --out out/gpu/throughput-old.md

The workload is the one nano-vllm's bench.py (function `main`,
https://github.com/GeeeekExplorer/nano-vllm/blob/bb823b3e06983d71485a8e1f23715ebd87d98ef8/bench.py)
compares engines with, as
`python -m mini_vllm bench throughput --preset nano-vllm` runs it: 256 requests, prompt and
output lengths each uniform over the integers 100 to 1024, token ids below 256,
temperature 0.6, EOS ignored, all in one `generate` call after a short warm-up. It is drawn
here with numpy's generator in the same order as that preset (prompt lengths, output
lengths, then each prompt's ids), so with the same seed both serve the same requests.
Output tokens are counted as nano-vllm counts them, the sum of `max_tokens`: with EOS
ignored every request generates exactly that many.

Only the public API that older copies of the package have too is used (`LLM(...)`,
`SamplingParams(...)`, `LLM.generate`, `llm.stats.num_steps`) and nothing of
mini_vllm.bench, so with PYTHONPATH pointing at an older copy (e.g. made with
`git archive <commit> mini_vllm | tar -x -C OLD`) the same script measures that copy,
for numbers before and after a change side by side. The report names the copy that ran.

Each shape gets a fresh engine; one that fails (e.g. its KV cache does not fit: lower
--max-num-seqs) is reported as failed and the next one runs. `--profile N` also runs
the first N requests under cProfile and writes the top 40 functions, by cumulative and
by own time, beside the --out file. `--device cpu` with `--models tiny` and small
ranges runs it anywhere, as the tests do.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import platform
import pstats
import shlex
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# Appended, not prepended: a copy on PYTHONPATH (or an installed one) wins over the checkout.
sys.path.append(str(ROOT))

DEFAULT_MODELS = "smollm2-135m,llama-3.2-1b-like,llama-3.1-8b-like"
PROMPT_TOKEN_RANGE = 256  # ids below this are in every model's vocabulary
TEMPERATURE = 0.6
PROFILE_TOP = 40


def parse_range(text: str) -> tuple[int, int]:
    """`MIN,MAX` (both included) as two integers, 1 <= MIN <= MAX."""
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX (two integers), got {text!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return low, high


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def engine_option(text: str) -> tuple[str, object]:
    """NAME=VALUE as an engine keyword: true/false as booleans, integers as ints."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--engine-option takes NAME=VALUE, got {text!r}")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return name, lowered == "true"
    return name, int(value) if value.lstrip("-").isdigit() else value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", default=DEFAULT_MODELS, help="comma-separated shapes (default: %(default)s)"
    )
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default: %(default)s)")
    parser.add_argument("--dtype", help="e.g. bfloat16 (default: the engine's for the device)")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "out" / "gpu" / "throughput_workload.md",
        help="markdown file for the table (default: out/gpu/throughput_workload.md)",
    )
    parser.add_argument("--num-prompts", type=positive_int, default=256, help="(default: 256)")
    parser.add_argument(
        "--input-range", type=parse_range, default=(100, 1024), help="MIN,MAX prompt tokens"
    )
    parser.add_argument(
        "--output-range", type=parse_range, default=(100, 1024), help="MIN,MAX output tokens"
    )
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the workload")
    parser.add_argument("--max-num-seqs", type=positive_int, default=256, help="(default: 256)")
    parser.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=16384, help="(default: 16384)"
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=2048,
        help="(default: 2048, a 1024-token prompt and 1024 new tokens)",
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another engine option for LLM(...), repeatable, e.g. async_scheduling=true or "
        "compilation_mode=vllm_compile (a copy too old for an option refuses it by name)",
    )
    parser.add_argument(
        "--profile",
        type=positive_int,
        metavar="N",
        help="also run the first N requests under cProfile and write its top functions",
    )
    return parser


def draw_workload(
    num_prompts: int, input_range: tuple[int, int], output_range: tuple[int, int], seed: int
) -> tuple[list[list[int]], list[int]]:
    """(prompts as token ids, output lengths), drawn as the bench's random dataset draws."""
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(input_range[0], input_range[1] + 1, size=num_prompts)
    output_lens = rng.integers(output_range[0], output_range[1] + 1, size=num_prompts)
    prompts = [rng.integers(0, PROMPT_TOKEN_RANGE, size=n).tolist() for n in input_lens]
    return prompts, [int(n) for n in output_lens]


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def write_profile(profiler: cProfile.Profile, path: Path, title: str) -> None:
    text = io.StringIO()
    text.write(f"# {title}\n")
    for order in ("cumulative", "tottime"):
        text.write(f"\n## top {PROFILE_TOP} by {order}\n")
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(PROFILE_TOP)
    path.write_text(text.getvalue(), encoding="utf-8")


def measure_one(model: str, args, prompts, output_lens, engine_kwargs: dict) -> dict:
    """Load `model`, warm up, time the workload in one `generate` call; a row of the table."""
    from mini_vllm import LLM, SamplingParams

    print(f"{model}: loading ...", flush=True)
    start = time.perf_counter()
    llm = LLM(model, **engine_kwargs)
    print(f"{model}: loaded in {time.perf_counter() - start:.1f} s; warm-up", flush=True)
    try:
        warmup = SamplingParams(temperature=TEMPERATURE, max_tokens=8, ignore_eos=True)
        llm.generate([p[:32] for p in prompts[:4]], warmup, use_tqdm=False)
        params = [
            SamplingParams(temperature=TEMPERATURE, max_tokens=n, ignore_eos=True)
            for n in output_lens
        ]
        print(f"{model}: {len(prompts)} requests at once ...", flush=True)
        steps_before = llm.stats.num_steps
        synchronize(args.device)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        synchronize(args.device)
        wall_s = time.perf_counter() - start
        steps = llm.stats.num_steps - steps_before
        failed = [o for o in outputs if getattr(o, "finish_reason", None) in ("error", "abort")]
        if failed:
            reason = getattr(failed[0], "error", None) or failed[0].finish_reason
            raise RuntimeError(f"{len(failed)} of {len(outputs)} requests failed: {reason}")
        if args.profile:
            count = min(args.profile, len(prompts))
            print(f"{model}: {count} requests under cProfile ...", flush=True)
            profiler = cProfile.Profile()
            profiler.enable()
            llm.generate(prompts[:count], params[:count], use_tqdm=False)
            synchronize(args.device)
            profiler.disable()
            path = args.out.parent / f"{args.out.stem}-profile-{model}.txt"
            write_profile(profiler, path, f"{model}: {count} requests of the workload")
            print(f"{model}: wrote {path}", flush=True)
    finally:
        del llm
        gc.collect()
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    prompt_tokens, output_tokens = sum(map(len, prompts)), sum(output_lens)
    return {
        "model": model,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "steps": steps,
        "wall_s": wall_s,
        "output_tps": output_tokens / wall_s,
        "total_tps": (prompt_tokens + output_tokens) / wall_s,
    }


def machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}"
    return f"{platform.processor() or platform.machine()} CPU; torch {torch.__version__}"


def markdown(args, rows: list[dict], engine_kwargs: dict, package: str) -> str:
    command = " ".join(shlex.quote(word) for word in ["python3", *sys.argv])
    if os.environ.get("PYTHONPATH"):
        command = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} {command}"
    settings = ", ".join(f"`{key}={value}`" for key, value in engine_kwargs.items())
    (in_low, in_high), (out_low, out_high) = args.input_range, args.output_range
    lines = [
        "# The nano-vllm offline workload through `mini_vllm.LLM`",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {machine(args.device)}",
        f"- mini_vllm: {package}",
        f"- command: `{command}`",
        f"- workload: {args.num_prompts} requests, prompt lengths uniform in [{in_low}, "
        f"{in_high}], output lengths uniform in [{out_low}, {out_high}], token ids below "
        f"{PROMPT_TOKEN_RANGE}, temperature {TEMPERATURE}, EOS ignored, numpy seed {args.seed}; "
        "one `generate` call after a 4-request warm-up",
        f"- engine: {settings}",
        "",
        "| model | prompts | prompt tokens | output tokens | steps | wall s "
        "| output tokens/s | total tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | failed: {row['error']} | | | | | | |")
            continue
        lines.append(
            f"| {row['model']} | {args.num_prompts} | {row['prompt_tokens']} | "
            f"{row['output_tokens']} | {row['steps']} | {row['wall_s']:.2f} | "
            f"{row['output_tps']:.1f} | {row['total_tps']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        print("--models is empty: name at least one shape, e.g. --models smollm2-135m")
        return 2
    longest = args.input_range[1] + args.output_range[1]
    if longest > args.max_model_len:
        print(
            f"the longest request can reach {longest} tokens (prompt + output) but "
            f"--max-model-len is {args.max_model_len}; raise it or narrow the ranges",
            file=sys.stderr,
        )
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"throughput_workload.py --device {args.device} needs an NVIDIA GPU with CUDA; "
            f"torch {torch.__version__} sees none here: run on a GPU machine, or give "
            "--device cpu with small shapes (--models tiny)",
            file=sys.stderr,
        )
        return 2
    import mini_vllm

    package = str(Path(mini_vllm.__file__).resolve().parent)
    print(f"mini_vllm from {package}", flush=True)
    prompts, output_lens = draw_workload(
        args.num_prompts, args.input_range, args.output_range, args.seed
    )
    engine_kwargs = {
        "device": args.device,
        **({"dtype": args.dtype} if args.dtype else {}),
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len,
        **dict(engine_option(text) for text in args.engine_option),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in models:
        try:
            row = measure_one(model, args, prompts, output_lens, engine_kwargs)
        except Exception as exc:  # one shape failing (e.g. out of memory) leaves the others
            row = {"model": model, "error": f"{type(exc).__name__}: {exc}".replace("|", "/")}
            print(f"{model}: failed: {row['error']}", flush=True)
        else:
            print(
                f"{model}: {row['output_tps']:.1f} output tokens/s ({row['output_tokens']} "
                f"output tokens in {row['wall_s']:.2f} s, {row['steps']} steps)",
                flush=True,
            )
        rows.append(row)
    args.out.write_text(markdown(args, rows, engine_kwargs, package), encoding="utf-8")
    print(f"wrote {args.out}")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
