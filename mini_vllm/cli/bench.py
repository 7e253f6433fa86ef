"""`python -m mini_vllm bench <what>`: benchmarks, one sub-command each.

vLLM counterpart: vllm/entrypoints/cli/benchmark/ (`vllm bench latency|throughput|serve`).
The measuring code lives in mini_vllm/bench/; this file only parses arguments. To add
a benchmark, write `_add_<name>(parser)` (its docstring is the description) and
`_run_<name>(args)` and list them in `SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

from mini_vllm.cli.options import model_options, option


def _add_model_options(p: argparse.ArgumentParser, dtype: bool = True) -> None:
    model_options(p, dtype=dtype)
    option(p, "--no-hf", "time mini_vllm only", action="store_true")


def _add_output_options(p: argparse.ArgumentParser, default: str) -> None:
    option(p, "--output", f"markdown file for the result (default: {default})")
    option(p, "--no-output", "print only, write no file", action="store_true")


def _say(line: str) -> None:
    print(line, flush=True)  # progress shows as it comes, also through a pipe


def _check_output(args: argparse.Namespace, default: str) -> None:
    """Refuse an output path that cannot be written now, before minutes of measuring."""
    from mini_vllm.errors import UserError

    if args.no_output:
        return
    out = Path(args.output or default)
    if out.is_dir():
        raise UserError(f"--output {out} is a directory; give a file name, e.g. {out}/result.md")
    try:  # the one sure test is to write there
        out.parent.mkdir(parents=True, exist_ok=True)
        existed = out.exists()
        with open(out, "a", encoding="utf-8"):
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        raise UserError(
            f"cannot write the result to {out} ({exc.strerror or exc}); give another "
            "--output, or --no-output to print only"
        ) from None


def _write_result(args: argparse.Namespace, text: str, default: str) -> None:
    if args.no_output:
        return
    out = Path(args.output or default)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")


def _add_decode(p: argparse.ArgumentParser) -> None:
    """Time mini_vllm's decode loop and transformers' generate on the same model, prompt and
    settings (greedy, EOS ignored), and print tokens/s for both and their ratio."""
    _add_model_options(p)
    option(p, "--new-tokens", "tokens to generate per request", type=int, default=64)
    option(p, "--repeats", "timed repeats, median reported", type=int, default=5)
    option(p, "--warmup", "untimed warm-up requests", type=int, default=1)
    option(
        p,
        "--compile",
        "compile our model with torch.compile (Inductor) first; the warm-up request compiles it",
        action="store_true",
    )
    _add_output_options(
        p,
        "benchmarks/results/decode-<device type>.md, or "
        "decode-graphs-<device type>.md with --modes",
    )
    g = p.add_argument_group(
        "graph modes (Phase 05): step time per batch size and mode, in one run"
    )
    option(
        g,
        "--modes",
        "comma-separated modes among eager, full, piecewise, full_and_piecewise, "
        "compile, compile+full, compile+piecewise, compile+full_and_piecewise, full+async, "
        "compile+full+async (+async: async scheduling), compile-nofusion+full[+async] (without "
        "the fusion pass), torch-only+eager, torch-only+full, torch-only+compile+full+async "
        "(no kernel of mini_vllm's own: custom_ops=none); switches to the engine benchmark "
        "(default model there: smollm2-135m, random weights)",
    )
    option(g, "--batch-sizes", "comma-separated", default="1,2,4,8,16,32,64")
    option(g, "--context-len", "prompt tokens before decoding", type=int, default=128)
    option(g, "--steps", "timed decode steps per point", type=int, default=30)
    option(g, "--compare-hf", "also time transformers' eager generate", action="store_true")
    option(
        g,
        "--compare-hf-compile",
        "also time transformers with a static cache and torch.compile (CUDA, first batch size)",
        action="store_true",
    )


def _run_decode(args: argparse.Namespace) -> int:
    from mini_vllm.bench.decode import format_markdown, run_decode_bench
    from mini_vllm.errors import UserError

    if args.modes is not None:
        return _run_decode_graphs(args)

    if args.new_tokens < 1 or args.repeats < 1 or args.warmup < 0:
        raise UserError("--new-tokens and --repeats must be >= 1 and --warmup >= 0")
    suffix = "-compiled" if args.compile else ""
    default_output = f"benchmarks/results/decode-{args.device.split(':')[0]}{suffix}.md"
    _check_output(args, default_output)
    result = run_decode_bench(
        args.model,
        args.device,
        args.dtype,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        with_hf=not args.no_hf,
        log=_say,
        compile=args.compile,
    )
    print(f"mini_vllm decode loop: {result.ours_tokens_per_s:.1f} tokens/s")
    if result.hf_s:
        print(f"transformers generate: {result.hf_tokens_per_s:.1f} tokens/s")
        print(f"ratio: {result.ratio:.2f}x")
    if result.hf_one_thread_s:
        print(
            "transformers generate pinned to 1 thread (control): "
            f"{result.hf_one_thread_tokens_per_s:.1f} tokens/s (ratio "
            f"{result.ours_tokens_per_s / result.hf_one_thread_tokens_per_s:.2f}x)"
        )
    _write_result(args, format_markdown(result, _decode_command_line(args)), default_output)
    return 0


def _run_decode_graphs(args: argparse.Namespace) -> int:
    from mini_vllm.bench.decode_graphs import (
        format_graph_markdown,
        run_graph_decode_bench,
    )
    from mini_vllm.bench.harness import check_modes
    from mini_vllm.errors import UserError

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise UserError("--modes is empty: name at least one mode, e.g. --modes eager,full")
    check_modes(modes)
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise UserError(
            f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}"
        ) from None
    if any(b < 1 for b in batch_sizes) or args.context_len < 1 or args.steps < 1:
        raise UserError("batch sizes, --context-len and --steps must be >= 1")
    model = args.model if args.model != "smollm2-135m-instruct" else "smollm2-135m"
    default_output = f"benchmarks/results/decode-graphs-{args.device.split(':')[0]}.md"
    _check_output(args, default_output)
    report = run_graph_decode_bench(
        model,
        args.device,
        args.dtype,
        batch_sizes,
        modes,
        args.context_len,
        args.steps,
        compare_hf=args.compare_hf,
        log=_say,
        compare_hf_compile=args.compare_hf_compile,
    )
    command = "python -m mini_vllm bench decode " + " ".join(
        shlex.quote(w)
        for w in [
            "--device",
            args.device,
            "--batch-sizes",
            args.batch_sizes,
            "--modes",
            args.modes,
            *(["--model", args.model] if args.model != "smollm2-135m-instruct" else []),
            *(["--compare-hf"] if args.compare_hf else []),
            *(["--compare-hf-compile"] if args.compare_hf_compile else []),
        ]
    )
    text = format_graph_markdown(report, command)
    print(text)
    _write_result(args, text, default_output)
    return 0


def _decode_command_line(args: argparse.Namespace) -> str:
    """The command, rebuilt from the parsed options, for the result file."""
    words = ["python", "-m", "mini_vllm", "bench", "decode", "--device", args.device]
    defaults = {
        "model": "smollm2-135m-instruct",
        "dtype": "auto",
        "new_tokens": 64,
        "repeats": 5,
        "warmup": 1,
    }
    for name, default in defaults.items():
        value = getattr(args, name)
        if value != default:
            words += [f"--{name.replace('_', '-')}", str(value)]
    if args.no_hf:
        words.append("--no-hf")
    if args.compile:
        words.append("--compile")
    if args.output:
        words += ["--output", args.output]
    return " ".join(shlex.quote(w) for w in words)


def _add_throughput(p: argparse.ArgumentParser) -> None:
    """Serve many prompts at once through mini_vllm's `LLM.generate` and print output tokens/s,
    total tokens/s and requests/s, as vllm bench throughput does. Datasets: a shipped set of
    chat questions (the default), timed beside transformers' generate one prompt at a time on
    the same weights; or vLLM's random dataset (token-id prompts, seeded lengths, EOS
    ignored). --preset nano-vllm runs the offline workload nano-vllm and mini-sglang compare
    engines with (256 requests, prompt and output lengths uniform in 100..1024, temperature
    0.6) and lists published numbers for it."""
    from mini_vllm.bench.throughput import DATASETS, PRESETS

    model_options(p)
    option(
        p,
        "--hf",
        "also time transformers' generate on the same weights, one prompt at a time (default: "
        "on for the questions, off for the random dataset, where it would take hours)",
        action=argparse.BooleanOptionalAction,
    )
    data = p.add_argument_group("dataset (as vllm bench throughput)")
    option(
        data,
        "--dataset-name",
        "questions: shipped chat questions; random: token ids, exact lengths (default: "
        "questions, or random with --preset)",
        choices=DATASETS,
    )
    option(
        data,
        "--preset",
        "a standard workload: nano-vllm = 256 requests, prompt and output lengths uniform in "
        "[100, 1024], temperature 0.6, EOS ignored; it also sets --max-num-seqs 256 and "
        "--max-num-batched-tokens 16384 unless given",
        choices=sorted(PRESETS),
    )
    option(data, "--num-prompts", "requests (default: 16 questions, 100 random)", type=int)
    option(data, "--new-tokens", "questions: tokens generated per prompt (default: 64)", type=int)
    option(data, "--random-input-len", "random: mean prompt length (default: 128)", type=int)
    option(data, "--random-output-len", "random: mean output length (default: 64)", type=int)
    option(
        data,
        "--random-range-ratio",
        "random: lengths uniform in [floor(len * (1 - r)), ceil(len * (1 + r))], r in [0, 1) "
        "(default: 0)",
        type=float,
    )
    option(data, "--seed", "seeds the prompts, their lengths and the engine", type=int, default=0)
    option(data, "--temperature", "0: greedy (default: 0; 0.6 with --preset)", type=float)
    engine = p.add_argument_group("engine (default: the engine's own, or the preset's)")
    option(engine, "--max-num-seqs", "requests in one batch at most", type=int)
    option(engine, "--max-num-batched-tokens", "tokens one step may compute", type=int)
    _add_output_options(p, "benchmarks/results/throughput-<device>.md")


# The workload options and how each reads on a command line.
_THROUGHPUT_WORKLOAD_OPTIONS = {
    "num_prompts": "--num-prompts",
    "new_tokens": "--new-tokens",
    "random_input_len": "--random-input-len",
    "random_output_len": "--random-output-len",
    "random_range_ratio": "--random-range-ratio",
    "temperature": "--temperature",
}
_RANDOM_ONLY = ("random_input_len", "random_output_len", "random_range_ratio")


def _throughput_workload(args: argparse.Namespace):
    """The ThroughputWorkload the options describe, or a UserError saying which option to
    change."""
    from mini_vllm.bench.throughput import PRESETS, ThroughputWorkload
    from mini_vllm.errors import UserError

    given = [name for name in _THROUGHPUT_WORKLOAD_OPTIONS if getattr(args, name) is not None]
    if args.preset is not None:
        if args.dataset_name == "questions":
            raise UserError(
                f"--preset {args.preset} is a random-dataset workload; drop --dataset-name "
                "questions"
            )
        if given:
            flags = " ".join(_THROUGHPUT_WORKLOAD_OPTIONS[name] for name in given)
            raise UserError(
                f"--preset {args.preset} fixes the workload, so {flags} would change what its "
                "published numbers compare with; drop it, or give --dataset-name random with "
                "your own numbers instead of --preset"
            )
        return dataclasses.replace(PRESETS[args.preset].workload, seed=args.seed)
    dataset = args.dataset_name or "questions"
    if dataset == "questions":
        random_only = [_THROUGHPUT_WORKLOAD_OPTIONS[n] for n in _RANDOM_ONLY if n in given]
        if random_only:
            verb = "applies" if len(random_only) == 1 else "apply"
            raise UserError(
                f"{' '.join(random_only)} {verb} only to the random dataset; add --dataset-name "
                "random (or give --new-tokens for the questions)"
            )
        return ThroughputWorkload(
            dataset="questions",
            num_prompts=_or(args.num_prompts, 16),
            output_len=_or(args.new_tokens, 64),
            seed=args.seed,
            temperature=_or(args.temperature, 0.0),
        )
    if args.new_tokens is not None:
        raise UserError(
            "--new-tokens applies to the questions; with --dataset-name random give "
            "--random-output-len (the mean output length)"
        )
    return ThroughputWorkload(
        dataset="random",
        num_prompts=_or(args.num_prompts, 100),
        input_len=_or(args.random_input_len, 128),
        output_len=_or(args.random_output_len, 64),
        range_ratio=_or(args.random_range_ratio, 0.0),
        seed=args.seed,
        temperature=_or(args.temperature, 0.0),
    )


def _or(value, default):
    return default if value is None else value


def _throughput_command_line(args: argparse.Namespace) -> str:
    """The command, rebuilt from the options given, for the result file."""
    words = ["python", "-m", "mini_vllm", "bench", "throughput", "--device", args.device]
    if args.model != "smollm2-135m-instruct":
        words += ["--model", args.model]
    if args.dtype != "auto":
        words += ["--dtype", args.dtype]
    if args.preset is not None:
        words += ["--preset", args.preset]
    if args.dataset_name is not None:
        words += ["--dataset-name", args.dataset_name]
    for name, flag in _THROUGHPUT_WORKLOAD_OPTIONS.items():
        if getattr(args, name) is not None:
            words += [flag, f"{getattr(args, name):g}"]
    if args.seed != 0:
        words += ["--seed", str(args.seed)]
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, name) is not None:
            words += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.hf is not None:
        words.append("--hf" if args.hf else "--no-hf")
    if args.output:
        words += ["--output", args.output]
    return " ".join(shlex.quote(w) for w in words)


def _run_throughput(args: argparse.Namespace) -> int:
    from mini_vllm.bench.throughput import (
        format_throughput_markdown,
        run_throughput_bench,
    )
    from mini_vllm.errors import UserError

    workload = _throughput_workload(args)
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = f"--{name.replace('_', '-')}"
            raise UserError(f"{flag} must be >= 1, got {value} (leave it out for the default)")
    default_output = f"benchmarks/results/throughput-{args.device.split(':')[0]}.md"
    _check_output(args, default_output)
    result = run_throughput_bench(
        args.model,
        args.device,
        workload,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        with_hf=args.hf,
        log=_say,
    )
    text = format_throughput_markdown(result, _throughput_command_line(args))
    print(text)
    _write_result(args, text, default_output)
    return 0


def _add_reliability(p: argparse.ArgumentParser) -> None:
    """Serve a load of prompts in every CPU engine mode under forced preemption, comparing each
    output with the prompt served alone; then inject faults at every point of a step and check
    that the engine goes on serving with every block free and no request lost."""
    model_options(p, model="tiny", dtype=False)
    option(p, "--num-prompts", "prompts in the load", type=int, default=200)
    _add_output_options(p, "benchmarks/results/reliability-<device>.md")


def _run_reliability(args: argparse.Namespace) -> int:
    from mini_vllm.bench.reliability import format_reliability_markdown, run_reliability_report
    from mini_vllm.errors import UserError

    if args.num_prompts < 1:
        raise UserError("--num-prompts must be >= 1")
    if args.device not in ("cpu", "cuda"):
        raise UserError(f"--device {args.device}: use cpu or cuda")
    default_output = f"benchmarks/results/reliability-{args.device}.md"
    _check_output(args, default_output)
    report = run_reliability_report(args.model, args.num_prompts, log=_say, device=args.device)
    words = ["python", "-m", "mini_vllm", "bench", "reliability"]
    if args.device != "cpu":
        words += ["--device", args.device]
    if args.model != "tiny":
        words += ["--model", args.model]
    if args.num_prompts != 200:
        words += ["--num-prompts", str(args.num_prompts)]
    text = format_reliability_markdown(report, " ".join(shlex.quote(w) for w in words))
    print(text)
    _write_result(args, text, default_output)
    failed = [f for f in report.faults if f.fired and (f.bricked or f.blocks_leaked)]
    return 1 if failed or any(load.num_blocks_leaked for load in report.loads) else 0


# The options of `bench serve` besides the engine's: (flag, help, argparse options).
_SERVE_OPTIONS = [
    (
        "--base-url",
        "a running server to load, e.g. http://127.0.0.1:8000 (default: start one "
        "with the engine options above, on a free port)",
        {},
    ),
    (
        "--served-model-name",
        "the model name to send (default: what the server's /v1/models lists)",
        {},
    ),
    (
        "--dataset-name",
        "random (token ids, exact lengths) or questions (a shipped set of text prompts)",
        dict(default="random", choices=["random", "questions"]),
    ),
    ("--num-prompts", "requests per run", dict(type=int, default=100)),
    ("--random-input-len", "prompt tokens (mean)", dict(type=int, default=128)),
    ("--random-output-len", "tokens to generate per request (mean)", dict(type=int, default=64)),
    (
        "--random-range-ratio",
        "lengths are uniform in [len * (1 - r), len * (1 + r)]",
        dict(type=float, default=0.0),
    ),
    (
        "--dataset-seed",
        "seed of the prompts, their lengths and the arrival times",
        dict(type=int, default=0),
    ),
    (
        "--request-rate",
        "requests per second, Poisson arrivals; inf: all at once; several, "
        "comma-separated, run one after another on the same server",
        dict(default="inf"),
    ),
    ("--max-concurrency", "requests in flight at most (default: no limit)", dict(type=int)),
    (
        "--ignore-eos",
        "generate exactly the output length (EOS does not stop a request)",
        dict(action="store_true"),
    ),
    (
        "--goodput",
        "SLOs in ms, e.g. --goodput ttft:500 itl:50 (metrics: ttft, tpot, itl, e2el; "
        "itl: a request's largest gap)",
        dict(nargs="+", metavar="METRIC:MS"),
    ),
    ("--percentiles", "latency percentiles to report", dict(default="50,90,99")),
    ("--label", "the configuration's name in the report (default: from the engine options)", {}),
    (
        "--save-json",
        "also write the result as JSON (python -m mini_vllm.bench.serve combine "
        "puts several side by side)",
        {},
    ),
    (
        "--server-timeout",
        "seconds to wait for a started server's /health",
        dict(type=float, default=600.0),
    ),
    ("--request-timeout", "seconds one request may take", dict(type=float, default=600.0)),
    (
        "--api-key",
        "sent as `Authorization: Bearer KEY` with every request; a server the benchmark starts "
        "wants it (default: $OPENAI_API_KEY, else no key); never written to the report",
        dict(metavar="KEY"),
    ),
]


def _number(text: str) -> float:
    """A finite float, or an argparse error."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def _extra_body(text: str) -> dict:
    from mini_vllm.bench.serve import parse_extra_body
    from mini_vllm.errors import UserError

    try:
        return parse_extra_body(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--extra-body ")) from None


# The sampling options of `bench serve`, as vllm bench serve's; one not given is not sent.
_SAMPLING_OPTIONS = [
    (
        "--temperature",
        "sampling temperature; 0 is greedy (default: 0.0, greedy, unless --extra-body gives one)",
        dict(type=_number),
    ),
    (
        "--top-p",
        "top-p (nucleus) sampling: the smallest set of tokens of this mass",
        dict(type=_number),
    ),
    ("--top-k", "top-k sampling: the k most likely tokens (-1: all)", dict(type=int)),
    ("--min-p", "min-p sampling: tokens at least this times the likeliest's", dict(type=_number)),
    ("--presence-penalty", "penalty on tokens already generated", dict(type=_number)),
    ("--frequency-penalty", "penalty per time a token was generated", dict(type=_number)),
    (
        "--repetition-penalty",
        "penalty on tokens of the prompt and the output (1: none)",
        dict(type=_number),
    ),
    (
        "--extra-body",
        "a JSON object merged into every request body, e.g. "
        """'{"stop": ["\\n\\n"], "logprobs": 2}' (not the fields the benchmark sets: """
        "model, prompt, max_tokens, stream, stream_options, ignore_eos, return_token_ids)",
        dict(type=_extra_body, metavar="JSON"),
    ),
]


def _add_serve(p: argparse.ArgumentParser) -> None:
    """Send a dataset of prompts to an OpenAI-compatible server (one started with the engine
    options, or --base-url) as streaming clients, at a request rate (Poisson) or a concurrency;
    report throughput, TTFT, TPOT, ITL and end-to-end latency at percentiles, goodput under
    SLOs, and the server's decode-graph hit rate and padding waste read from its /metrics."""
    from mini_vllm.cli.serve import add_engine_options

    add_engine_options(p)
    group = p.add_argument_group("benchmark options (as vllm bench serve)")
    for flag, help_text, kwargs in _SERVE_OPTIONS:
        option(group, flag, help_text, **kwargs)
    group = p.add_argument_group(
        "sampling options (as vllm bench serve's; one not given is not sent)"
    )
    for flag, help_text, kwargs in _SAMPLING_OPTIONS:
        option(group, flag, help_text, **kwargs)
    _add_output_options(p, "benchmarks/results/serve-<device>.md, and a .png plot beside it")


def _serve_label(args: argparse.Namespace, config) -> str:
    """The configuration's short name: eager, or [compile+]<graph mode>[+async]."""
    if args.label:
        return args.label
    if config is None:
        return "server"
    if config.enforce_eager:
        return "eager"
    parts = ["compile"] if config.compilation_mode.name != "NONE" else []
    parts.append(config.cudagraph_mode.name.lower())
    if config.async_scheduling:
        parts.append("async")
    return "+".join(parts)


def _serve_command_line(args: argparse.Namespace) -> str:
    from mini_vllm.cli.serve import engine_argv

    words = ["python", "-m", "mini_vllm", "bench", "serve"]
    if args.base_url:
        words += ["--base-url", args.base_url]
    else:
        defaults = {"--dtype": "auto", "--device": "cpu"}
        engine = engine_argv(args)
        for flag, value in zip(engine[0:6:2], engine[1:6:2]):  # model, device, dtype
            if defaults.get(flag) != value:
                words += [flag, value]
        words += engine[6:]
    for flag, _, kwargs in _SERVE_OPTIONS + _SAMPLING_OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None or value is False or value == kwargs.get("default"):
            continue
        if flag in ("--base-url", "--save-json", "--api-key"):  # never the key
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *value]
        elif isinstance(value, dict):
            words += [flag, json.dumps(value)]
        else:
            words += [flag, str(value)]
    if args.output:
        words += ["--output", args.output]
    return " ".join(shlex.quote(w) for w in words)


def _run_serve(args: argparse.Namespace) -> int:
    from mini_vllm.bench.serve import (
        SAMPLING_FIELDS,
        format_serve_markdown,
        parse_goodput,
        parse_request_rates,
        plot_report,
        run_serve_bench,
        sample_requests,
        sampling_options,
    )
    from mini_vllm.cli.serve import engine_argv, engine_kwargs, require_serving_packages
    from mini_vllm.engine.engine_config import EngineConfig
    from mini_vllm.errors import UserError

    require_serving_packages()
    extra_body = args.extra_body or {}
    sampling = sampling_options(
        extra_body, **{name: getattr(args, name) for name in SAMPLING_FIELDS}
    )
    api_key = args.api_key
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY") or None
    elif not api_key.strip():
        raise UserError("--api-key is empty: give the server's key, or leave --api-key out")
    rates = parse_request_rates(args.request_rate)
    slo = parse_goodput(args.goodput)
    try:
        percentiles = [float(p) for p in args.percentiles.split(",")]
    except ValueError:
        raise UserError(
            f"--percentiles must be comma-separated numbers, got {args.percentiles!r}"
        ) from None
    if not all(0 < p <= 100 for p in percentiles):
        raise UserError("--percentiles must be in (0, 100]")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise UserError("--max-concurrency must be >= 1")
    # A bad engine option fails now, not in the server.
    config = None if args.base_url else EngineConfig.from_kwargs(**engine_kwargs(args))
    device = "remote" if args.base_url else args.device.split(":")[0]
    default_output = f"benchmarks/results/serve-{device}.md"
    _check_output(args, default_output)
    requests = sample_requests(
        args.dataset_name,
        args.num_prompts,
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
        args.dataset_seed,
    )
    dataset = dict(
        name=args.dataset_name,
        num_prompts=args.num_prompts,
        input_len=args.random_input_len if args.dataset_name == "random" else "text",
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
        seed=args.dataset_seed,
        ignore_eos=args.ignore_eos,
    )
    report = run_serve_bench(
        args.base_url,
        args.served_model_name,
        requests,
        rates,
        args.max_concurrency,
        args.ignore_eos,
        slo,
        percentiles,
        dataset,
        command=_serve_command_line(args),
        label=_serve_label(args, config),
        engine_args=None if args.base_url else engine_argv(args),
        seed=args.dataset_seed,
        server_timeout=args.server_timeout,
        request_timeout=args.request_timeout,
        log=_say,
        sampling=sampling,
        extra_body=extra_body,
        api_key=api_key,
    )
    plot_path = None
    if not args.no_output:
        plot_path = Path(args.output or default_output).with_suffix(".png")
        if not plot_report(report, plot_path):
            print("note: no plot (matplotlib is not installed: pip install matplotlib)")
            plot_path = None
    text = format_serve_markdown(report, str(plot_path) if plot_path else None)
    print(text)
    _write_result(args, text, default_output)
    if args.save_json:
        Path(args.save_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save_json).write_text(report.to_json(), encoding="utf-8")
        print(f"wrote {args.save_json}")
    failed = sum(run.metrics["failed"] for run in report.runs)
    if failed:
        print(f"{failed} request(s) failed: see the errors above", file=sys.stderr)
    return 1 if failed else 0


# name: (one-line help, adds the options, runs it); the description is the adder's docstring.
def _add_startup(p: argparse.ArgumentParser) -> None:
    """Start an engine in a fresh process with empty caches (cold), then again on the same
    caches (warm, a restart on the same machine); print the time to the first token and
    the compile, capture and autotune time of each start. A host's speed drifts by tens of
    percent within an hour, so the warm start is measured several times, with the median."""
    model_options(p, model="smollm2-135m", dtype=False)
    option(p, "--compilation-mode", "none or vllm_compile", default="vllm_compile")
    option(
        p,
        "--cudagraph-mode",
        "none, piecewise, full or full_and_piecewise",
        default="full_and_piecewise",
    )
    from mini_vllm.bench.startup import DEFAULT_WARM_STARTS

    option(
        p, "--warm-starts", "warm starts after the cold one", type=int, default=DEFAULT_WARM_STARTS
    )
    _add_output_options(p, "benchmarks/results/startup-<device>.md")


def _run_startup(args: argparse.Namespace) -> int:
    from mini_vllm.bench.startup import (
        DEFAULT_WARM_STARTS,
        format_startup_markdown,
        run_startup_bench,
    )
    from mini_vllm.engine.engine_config import EngineConfig

    # Checked here, in seconds, rather than in a child process after the cold start's work.
    EngineConfig.from_kwargs(
        model=args.model,
        device=args.device,
        compilation_mode=args.compilation_mode,
        cudagraph_mode=args.cudagraph_mode,
    )
    if args.warm_starts < 1:
        from mini_vllm.errors import UserError

        raise UserError(f"--warm-starts must be at least 1, got {args.warm_starts}")
    default_output = f"benchmarks/results/startup-{args.device.split(':')[0]}.md"
    _check_output(args, default_output)
    runs = run_startup_bench(
        args.model,
        args.device,
        args.compilation_mode,
        args.cudagraph_mode,
        log=_say,
        warm_starts=args.warm_starts,
    )
    words = ["python", "-m", "mini_vllm", "bench", "startup", "--device", args.device]
    if args.model != "smollm2-135m":
        words += ["--model", args.model]
    if args.compilation_mode != "vllm_compile":
        words += ["--compilation-mode", args.compilation_mode]
    if args.cudagraph_mode != "full_and_piecewise":
        words += ["--cudagraph-mode", args.cudagraph_mode]
    if args.warm_starts != DEFAULT_WARM_STARTS:
        words += ["--warm-starts", str(args.warm_starts)]
    command = " ".join(shlex.quote(w) for w in words)
    text = format_startup_markdown(
        runs, command, args.model, args.compilation_mode, args.cudagraph_mode
    )
    print(text)
    _write_result(args, text, default_output)
    return 0


SUBCOMMANDS = {
    "decode": ("our decode loop vs transformers' generate, batch 1", _add_decode, _run_decode),
    "throughput": (
        "continuous batching vs transformers' generate one prompt at a time",
        _add_throughput,
        _run_throughput,
    ),
    "reliability": (
        "a load under preemption and injected faults, in every CPU engine mode",
        _add_reliability,
        _run_reliability,
    ),
    "startup": (
        "time to the first token of a fresh engine, cold and warm caches",
        _add_startup,
        _run_startup,
    ),
    "serve": (
        "load an OpenAI-compatible server: TTFT, ITL, TPOT, throughput, goodput",
        _add_serve,
        _run_serve,
    ),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmarks (decode, ...)", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    sub.required = True
    for name, (summary, add, _) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=summary, description=" ".join(add.__doc__.split())))


def run(args: argparse.Namespace) -> int:
    _, _, run_one = SUBCOMMANDS[args.bench_command]
    return run_one(args)
