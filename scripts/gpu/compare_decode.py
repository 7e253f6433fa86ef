#!/usr/bin/env python3
"""One decode step of gpt-fast, of transformers and of mini_vllm, side by side, same shapes.

    python3 scripts/gpu/compare_decode.py [--models smollm2-135m,llama-3.2-1b-like,...]
        [--batches 1] [--rounds 3] [--steps 100] [--gpt-fast .thirdparty/gpt-fast] [--out DIR]
    python3 scripts/gpu/compare_decode.py --dry-run   # any machine: tiny models on the CPU

gpt-fast (pytorch-labs/gpt-fast) is not part of this repository: `bash
scripts/gpu/fetch_gpt_fast.sh` copies its model.py and generate.py, at the commit the book
cites, into .thirdparty/gpt-fast/ (ignored by git); without them its rows are skipped.

Each engine decodes B requests of --context random prompt tokens with random weights in
bfloat16, the shape of a named mini_vllm model (mini_vllm/models/config.py):
- gpt-fast: its `Transformer` from a `ModelArgs` of the shape, its `decode_one_token`
  compiled as generate.py's `main` compiles it (torch.compile, mode="reduce-overhead",
  fullgraph=True; the Inductor settings generate.py makes on import come with it), run by
  its own `generate` with generate.py's sampling defaults (temperature 0.8, top-k 200);
- transformers: `LlamaForCausalLM` from a `LlamaConfig` of the shape; `generate` with a
  static cache (`cache_implementation="static"`) and the forward compiled by `generate`
  itself (`CompileConfig(fullgraph=True, mode="reduce-overhead")`; a version without
  `CompileConfig`: `model.forward` compiled by hand, as its "Optimizing inference" guide
  shows); greedy;
- transformers-step: that guide's other recipe, gpt-fast's pattern on transformers' model:
  a `StaticCache` and a compiled function that runs the forward on one token and takes
  the argmax (SDPA's math backend), called in a loop; greedy;
- mini_vllm: the engine as the benchmarks build it (mini_vllm/bench/harness.py
  `decode_engine`) in each of --modes: full_and_piecewise is `EngineConfig`'s default on a
  GPU (graphs, no compilation), compile+full+async the fastest configuration; greedy.
A transformers compile that fails is run eagerly instead, and its row says so.

Timing: synchronised wall time. A step ends when its tokens are on the host (gpt-fast: its
`generate` callback reads them; transformers: the streamer `generate` hands each token to;
mini_vllm: the engine step's return, `measure_batch` of mini_vllm/bench/decode_graphs.py);
step ms = the median gap between consecutive ends, after --warmup untimed steps.
Back-to-back ms: --steps steps of the decode loop without the host reading a token
(gpt-fast's `decode_n_tokens`, the guide's loop as written), one sync at each end, / steps.
Kernels: GPU kernels of one step (torch.profiler; mini_vllm/bench/harness.py
`count_kernels`). Every engine, model and batch runs in a process of its own (gpt-fast's
import changes Inductor's settings for the whole process), the engines taking turns in
each of --rounds rounds (reversed every other round); the table gives the median over
the rounds and the lowest and highest. The report goes to OUT/compare_decode.md (and the
log to OUT/compare_decode.txt).

Time: every process builds and compiles its engine, which takes longer than the timing
(not yet measured here; expect tens of seconds a process for the SmolLM2 shape, minutes for
the 8B one, gpt-fast's coordinate-descent tuning among the longest); a later round finds
Inductor's cache warm. Where a command's time is limited, time one shape a command, each
with its own --out, and --rounds 1 first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from gpukit import DEFAULT_OUT, ROOT, run_script

SCRIPT = Path(__file__).resolve()
MODELS = "smollm2-135m,llama-3.2-1b-like,llama-3.1-8b-like"
MODES = "full_and_piecewise,compile+full+async"
ENGINES = "gpt-fast,transformers,transformers-step,mini_vllm"
GPT_FAST_FILES = ("model.py", "generate.py")
GPT_FAST_SAMPLING = dict(temperature=0.8, top_k=200)  # generate.py main's defaults
FETCH = "bash scripts/gpu/fetch_gpt_fast.sh"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=MODELS, help="model shapes (default: %(default)s)")
    parser.add_argument("--batches", default="1", help="batch sizes (default: %(default)s)")
    parser.add_argument("--engines", default=ENGINES, help="engines (default: %(default)s)")
    parser.add_argument(
        "--modes", default=MODES, help="mini_vllm engine modes (default: %(default)s)"
    )
    parser.add_argument("--context", type=int, default=128, help="prompt tokens (default: 128)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps (default: 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps (default: 10)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per engine (default 3)")
    parser.add_argument(
        "--gpt-fast",
        type=Path,
        default=ROOT / ".thirdparty" / "gpt-fast",
        help=f"folder holding gpt-fast's model.py and generate.py ({FETCH} fills it)",
    )
    parser.add_argument(
        "--process-timeout", type=int, default=600, help="seconds one process may take"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build every engine at a tiny size on the CPU and run it eagerly; measure nothing",
    )


# --- One process: one engine, one model, one batch size -------------------------------------


def model_config(name: str, dry_run: bool):
    """The named shape; in a dry run two layers and a vocabulary of 512, widths kept."""
    import dataclasses

    from mini_vllm.models.config import get_model_config

    config = get_model_config(name)
    if dry_run:
        config = dataclasses.replace(config, num_hidden_layers=2, vocab_size=512)
    return config


@contextlib.contextmanager
def default_dtype_on(device, dtype):
    """New tensors land on `device` in `dtype` (how a model is built straight in bf16)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def random_weights(model, std: float) -> None:
    """Normal(0, std) matrices, unit norm weights: as mini_vllm's `random_init` draws them."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, std)


def gaps_ms(stamps: list[float], skip: int) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])][skip:]


def back_to_back_ms(prepare, decode, steps: int, device) -> float:
    """ms a step when `decode(steps)` runs its steps with one sync at each end (after
    `prepare()`, untimed): the median of three such runs, divided by the steps."""
    from mini_vllm.utils import synchronize

    times = []
    for _ in range(3):
        prepare()
        synchronize(device)
        start = time.perf_counter()
        decode(steps)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / steps * 1000


def kernels_of(device, fn) -> int | None:
    from mini_vllm.bench.harness import count_kernels

    try:
        return count_kernels(device, fn)[0]
    except Exception as exc:  # the profiler is a bonus here, not the measurement
        print(f"kernels not counted: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def run_gpt_fast(args, config, device, dtype) -> dict:
    import importlib
    import types

    import torch

    # generate.py imports gpt-fast's tokenizer (sentencepiece, tiktoken) at the top; no
    # text is encoded here, so a stub stands in for it.
    stub = types.ModuleType("tokenizer")
    stub.get_tokenizer = lambda *a, **k: None
    sys.modules.setdefault("tokenizer", stub)
    sys.path.insert(0, str(args.gpt_fast.resolve()))
    gf_model = importlib.import_module("model")
    gf = importlib.import_module("generate")

    shape = gf_model.ModelArgs(
        block_size=config.max_position_embeddings,
        vocab_size=config.vocab_size,
        n_layer=config.num_hidden_layers,
        n_head=config.num_attention_heads,
        dim=config.hidden_size,
        intermediate_size=config.intermediate_size,
        n_local_heads=config.num_key_value_heads,
        rope_base=config.rope_theta,
        norm_eps=config.rms_norm_eps,
    )
    if shape.head_dim != config.head_dim:  # gpt-fast derives it: dim // n_head
        raise RuntimeError(f"gpt-fast's head_dim {shape.head_dim} != {config.head_dim}")
    with default_dtype_on(device, dtype):
        model = gf_model.Transformer(shape)
    random_weights(model, config.initializer_range)
    if config.tie_word_embeddings:  # gpt-fast has no tied head; the same bytes are read
        model.output.weight = model.tok_embeddings.weight
    model.eval()
    how = "eager (dry run)"
    if not args.dry_run:
        gf.decode_one_token = torch.compile(
            gf.decode_one_token, mode="reduce-overhead", fullgraph=True
        )
        how = "decode_one_token compiled (reduce-overhead, fullgraph), as generate.py main"
    gen = torch.Generator().manual_seed(args.batch)
    prompt = torch.randint(3, config.vocab_size, (args.context,), generator=gen)
    prompt = prompt.to(device=device, dtype=torch.int)
    tokens = args.warmup + args.steps + 2  # the longest run: the first sizes the KV cache

    def run(new_tokens: int, callback=lambda token: token) -> None:
        gf.generate(
            model, prompt, new_tokens, args.batch, interactive=False, draft_model=None,
            callback=callback, **GPT_FAST_SAMPLING,
        )  # fmt: skip

    start = time.perf_counter()
    run(tokens)  # compiles and records the graph (generate.py main's warm-up run)
    setup_s = time.perf_counter() - start
    stamps: list[float] = []
    run(tokens, lambda token: (token.tolist(), stamps.append(time.perf_counter())))
    token = torch.zeros((args.batch, 1), dtype=torch.int, device=device)
    position = torch.tensor([args.context], dtype=torch.int, device=device)

    def decode(steps: int) -> None:
        """gpt-fast's own decode loop (the cache holds the last prompt; position after it)."""
        with torch.no_grad():  # as under generate's decorator: no recompile
            gf.decode_n_tokens(model, token, position.clone(), steps, **GPT_FAST_SAMPLING)

    return dict(
        how=how, steps_ms=gaps_ms(stamps, args.warmup), setup_s=setup_s,
        back_to_back_ms=back_to_back_ms(lambda: None, decode, args.steps, device),
        count_kernels=lambda: kernels_of(device, lambda: decode(1)),
    )  # fmt: skip


def transformers_model(config, device, dtype):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    with default_dtype_on(device, dtype):
        model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict()))
    random_weights(model, config.initializer_range)
    return model.eval()


def run_transformers_generate(args, config, device, dtype) -> dict:
    import torch
    from transformers.generation.streamers import BaseStreamer

    model = transformers_model(config, device, dtype)
    gen = torch.Generator().manual_seed(args.batch)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.context), generator=gen)
    ids = ids.to(device)
    tokens = args.warmup + args.steps + 1

    class StepClock(BaseStreamer):
        """generate hands it the prompt, then each new token, on the host."""

        def __init__(self) -> None:
            self.stamps: list[float] = []

        def put(self, value) -> None:
            self.stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    def run(new_tokens: int, streamer=None) -> None:
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=streamer,
        )  # fmt: skip

    model.generation_config.cache_implementation = "static"
    how = "eager, static cache (dry run)"
    if not args.dry_run:
        try:
            from transformers import CompileConfig

            model.generation_config.compile_config = CompileConfig(
                fullgraph=True, mode="reduce-overhead"
            )
            how = "static cache, forward compiled by generate (CompileConfig: reduce-overhead, "
            how += "fullgraph)"
        except ImportError:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            how = "static cache, model.forward compiled (reduce-overhead, fullgraph)"
    start = time.perf_counter()
    try:
        run(tokens)  # the first generate compiles the decode forward, the second replays
        run(tokens)
    except Exception as exc:
        if args.dry_run:
            raise
        how = f"EAGER, static cache: the compiled generate failed ({type(exc).__name__}: {exc})"
        print(how, file=sys.stderr)
        model.generation_config.compile_config = None
        model.generation_config.disable_compile = True
        vars(model).pop("forward", None)
        torch._dynamo.reset()
        run(tokens)
    setup_s = time.perf_counter() - start
    if "CompileConfig" in how and getattr(model, "_compiled_call", None) is None:
        how += " [but generate compiled nothing: it ran eagerly]"  # transformers 5's attribute
    clock = StepClock()
    run(tokens, clock)
    # stamps: the prompt, the prefill's token, then one a decode step
    return dict(
        how=how, steps_ms=gaps_ms(clock.stamps[1:], args.warmup), setup_s=setup_s,
        back_to_back_ms=None, kernels=None,
    )  # fmt: skip


def static_cache(model, batch: int, max_len: int, device, dtype):
    """transformers' StaticCache; the arguments an older version also asks for, if it does."""
    import inspect

    from transformers import StaticCache

    accepted = inspect.signature(StaticCache.__init__).parameters
    extra = dict(max_batch_size=batch, device=device, dtype=dtype)
    extra = {k: v for k, v in extra.items() if k in accepted}
    return StaticCache(config=model.config, max_cache_len=max_len, **extra)


def run_transformers_step(args, config, device, dtype) -> dict:
    import inspect

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = transformers_model(config, device, dtype)
    tokens = args.warmup + args.steps + 2
    cache = static_cache(model, args.batch, args.context + tokens + 8, device, dtype)
    gen = torch.Generator().manual_seed(args.batch)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.context), generator=gen)
    ids = ids.to(device)

    # transformers 5 names the argument `cache` (`past_key_values` is deprecated).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode_one_token(model, token, position, cache_position, cache):
        logits = model(
            token, position_ids=position, cache_position=cache_position,
            return_dict=False, use_cache=True, **{name: cache},
        )[0]  # fmt: skip
        return torch.argmax(logits[:, -1], dim=-1)[:, None]

    position = torch.tensor([args.context], device=device)
    step_fn, how = decode_one_token, "eager, StaticCache (dry run)"
    if not args.dry_run:
        step_fn = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
        how = "StaticCache, one-token step compiled (reduce-overhead, fullgraph)"

    first = [None]  # the token the prompt gave

    def prefill() -> None:
        """The prompt, eager, into the emptied cache (the guide's `reset`)."""
        cache.reset()
        with torch.no_grad():
            logits = model(
                ids, cache_position=torch.arange(args.context, device=device),
                return_dict=False, use_cache=True, **{name: cache},
            )[0]  # fmt: skip
        first[0] = torch.argmax(logits[:, -1], dim=-1)[:, None]
        position.fill_(args.context)

    def decode(steps: int, clock: list[float] | None = None) -> None:
        token = first[0]
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            for _ in range(steps):
                token = step_fn(model, token.clone(), None, position, cache)
                position.add_(1)  # the guide's `cache_position += 1`
                if clock is not None:
                    token.tolist()
                    clock.append(time.perf_counter())

    def run(new_tokens: int, clock: list[float] | None = None) -> None:
        """A request as gpt-fast's generate runs one: the prompt, new_tokens - 1 steps."""
        prefill()
        decode(new_tokens - 1, clock)

    start = time.perf_counter()
    try:
        run(tokens)
    except Exception as exc:
        if args.dry_run:
            raise
        how = f"EAGER, StaticCache: the compiled step failed ({type(exc).__name__}: {exc})"
        print(how, file=sys.stderr)
        torch._dynamo.reset()
        step_fn = decode_one_token
        run(tokens)
    setup_s = time.perf_counter() - start
    stamps: list[float] = []
    run(tokens, stamps)
    b2b = back_to_back_ms(prefill, decode, args.steps, device)
    prefill()
    return dict(
        how=how, steps_ms=gaps_ms(stamps, args.warmup), setup_s=setup_s,
        back_to_back_ms=b2b, count_kernels=lambda: kernels_of(device, lambda: decode(1)),
    )  # fmt: skip


def run_mini_vllm(args, config, device, dtype, mode: str) -> dict:
    from mini_vllm.bench.decode_graphs import (
        decode_floor_bytes,
        measure_batch,
        measure_copy_bandwidth,
        new_tokens_per_request,
    )
    from mini_vllm.bench.harness import decode_engine
    from mini_vllm.models.loader import build_model, load_model, random_init

    if args.dry_run:  # the shrunk shape is not a named one: built as load_model builds one
        model = build_model(config, device, dtype)
        random_init(model)
        model.process_weights_after_loading()
        model.eval()
        mode = "eager"  # no graphs on a CPU
    else:  # bfloat16, as `bench decode` runs a model on a GPU ("auto")
        model, _, _ = load_model(config.name, device=device, dtype="auto", progress=False)
    start = time.perf_counter()
    new_tokens = new_tokens_per_request(args.steps, args.warmup)
    engine = decode_engine(model, mode, [args.batch], args.context, new_tokens)
    setup_s = time.perf_counter() - start
    result = measure_batch(engine, args.batch, args.context, args.steps, args.warmup, device)
    bandwidth = measure_copy_bandwidth(device)
    floor = decode_floor_bytes(model, args.batch, args.context)
    return dict(
        how=f"engine mode {mode} ({result.runtime_mode})", step_ms=result.step_ms,
        back_to_back_ms=None, setup_s=setup_s, kernels=result.kernels,
        floor_ms=floor / bandwidth * 1000 if bandwidth else None,
    )  # fmt: skip


def one_process(argv: list[str]) -> int:
    """`compare_decode.py one-process ENGINE ...`: time one engine on one model and batch
    size in this process and print `RESULT {json}` (what the rounds start)."""
    parser = argparse.ArgumentParser(prog=f"{SCRIPT.name} one-process")
    parser.add_argument("engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    for name in ("context", "steps", "warmup"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--gpt-fast", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)

    import torch

    device = torch.device("cpu" if args.dry_run else "cuda")
    config = model_config(args.model, args.dry_run)
    engine, _, mode = args.engine.partition(":")
    runs = {
        "gpt-fast": run_gpt_fast,
        "transformers": run_transformers_generate,
        "transformers-step": run_transformers_step,
    }
    out = {"engine": args.engine, "model": args.model, "batch": args.batch}
    try:
        if engine == "mini_vllm":
            out |= run_mini_vllm(args, config, device, torch.bfloat16, mode)
        else:
            out |= runs[engine](args, config, device, torch.bfloat16)
            steps = out.pop("steps_ms")
            out["step_ms"] = statistics.median(steps)
            out["timed_steps"] = len(steps)
    except Exception as exc:  # one engine failing leaves the others' rows
        import traceback

        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    count = out.pop("count_kernels", None)
    print("RESULT " + json.dumps(out), flush=True)
    if count is not None:  # last, and after a first RESULT: a profiler crash loses only this
        out["kernels"] = count()
        print("RESULT " + json.dumps(out), flush=True)
    return 0


# --- The rounds, and the report ------------------------------------------------------------


def engine_list(args) -> list[str]:
    from mini_vllm.bench.harness import check_modes
    from mini_vllm.errors import UserError

    engines = []
    for engine in args.engines.split(","):
        if engine == "mini_vllm":
            try:
                check_modes(args.modes.split(","))
            except UserError as exc:
                raise SystemExit(str(exc)) from None
            engines += [f"mini_vllm:{mode}" for mode in args.modes.split(",")]
        elif engine in ("gpt-fast", "transformers", "transformers-step"):
            engines.append(engine)
        else:
            raise SystemExit(f"unknown engine {engine!r}; choose from {ENGINES}")
    return engines


def gpt_fast_present(directory: Path) -> bool:
    return all((directory / name).is_file() for name in GPT_FAST_FILES)


def gpt_fast_commit(directory: Path) -> str:
    commit = directory / "COMMIT"
    return commit.read_text().strip() if commit.is_file() else "unknown (no COMMIT file)"


# What torch.compile says when it gives up part of what the row's "how it ran" claims.
COMPILE_WARNINGS = ("skipping cudagraphs", "recompile_limit", "cache_size_limit")


def compile_warning(stderr: str) -> str | None:
    """The first line of a process's stderr saying that Inductor left out CUDA graphs or
    Dynamo stopped recompiling (the step then runs without them, or eagerly)."""
    for line in stderr.splitlines():
        if any(key in line for key in COMPILE_WARNINGS):
            return line.strip()[:200]
    return None


def run_one(args, engine: str, model: str, batch: int) -> dict:
    command = [sys.executable, str(SCRIPT), "one-process", engine, "--model", model]
    command += ["--batch", str(batch), "--gpt-fast", str(args.gpt_fast)]
    for name in ("context", "steps", "warmup"):
        command += [f"--{name}", str(getattr(args, name))]
    if args.dry_run:
        command.append("--dry-run")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    failed = {"engine": engine, "model": model, "batch": batch}
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=args.process_timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return failed | {"error": f"no result within {args.process_timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            if "error" in result:
                print(done.stderr[-3000:], file=sys.stderr)
            elif warning := compile_warning(done.stderr):
                result["how"] += f" [{warning}]"
            return result
    print(done.stderr[-3000:], file=sys.stderr)
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return failed | {"error": f"exit status {done.returncode}: {last[:300]}"}


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cell(text: str) -> str:
    """Text for a markdown table's cell."""
    return str(text).replace("|", "/").replace("\n", " ")


def summarise(runs: list[dict]) -> dict:
    """The median over the rounds of each number, the step's lowest and highest."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[-1]["error"], "how": "failed"}

    def median_of(key: str):
        values = [r[key] for r in good if r.get(key) is not None]
        return statistics.median(values) if values else None

    steps = [r["step_ms"] for r in good]
    spread = f"{min(steps):.3f}–{max(steps):.3f}" if len(steps) > 1 else "one run"
    if len(good) < len(runs):
        spread += f" ({len(runs) - len(good)} of {len(runs)} rounds failed)"
    return {
        "how": good[-1]["how"],
        "step_ms": statistics.median(steps),
        "spread": spread,
        "runs": len(good),
        "back_to_back_ms": median_of("back_to_back_ms"),
        "kernels": median_of("kernels"),
        "setup_s": median_of("setup_s"),
        "floor_ms": median_of("floor_ms"),
    }


def tables(args, engines: list[str], results: dict) -> list[str]:
    reference = next((e for e in engines if e.startswith("mini_vllm")), None)
    lines = []
    for model in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            rows = {e: summarise(results[(model, batch, e)]) for e in engines}
            ref = rows.get(reference, {}).get("step_ms")
            lines += [
                f"## {model}, batch {batch}",
                "",
                f"| engine | how it ran | step ms | spread | back-to-back ms | kernels "
                f"| setup s | step / {reference or 'mini_vllm'} |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for engine, row in rows.items():
                if "error" in row:
                    lines.append(
                        f"| {engine} | FAILED: {cell(row['error'])} | - | - | - | - | - | - |"
                    )
                    continue
                ratio = f"{row['step_ms'] / ref:.2f}x" if ref else "-"
                kernels = "-" if row["kernels"] is None else str(round(row["kernels"]))
                cells = [
                    engine, cell(row["how"]), fmt(row["step_ms"]), row["spread"],
                    fmt(row["back_to_back_ms"]), kernels, fmt(row["setup_s"], 1), ratio,
                ]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
            floor = next((r["floor_ms"] for r in rows.values() if r.get("floor_ms")), None)
            ratios = []
            others = [e for e in engines if not e.startswith("mini_vllm")]
            for mine in [e for e in engines if e.startswith("mini_vllm")]:
                for other in others:
                    a, b = rows[other].get("step_ms"), rows[mine].get("step_ms")
                    if a and b:
                        ratios.append(f"- {other} / {mine}: {a / b:.2f}x")
            lines += ["", "Ratios of the median steps:", *ratios] if ratios else [""]
            if floor:
                lines.append(
                    f"- weight-read floor (bytes a step must read / copy bandwidth): {floor:.3f} ms"
                )
            lines.append("")
    return lines


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        hf = version("transformers")
    except PackageNotFoundError:
        hf = "not installed"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return f"torch {torch.__version__}, transformers {hf}, mini_vllm {commit or 'unknown'}"


def compare(args, report) -> None:
    engines = engine_list(args)
    if "gpt-fast" in engines and not gpt_fast_present(args.gpt_fast):
        report(
            f"gpt-fast skipped: {args.gpt_fast} does not hold {' and '.join(GPT_FAST_FILES)}; "
            f"`{FETCH}` puts them there (or `{FETCH} /path/to/a/clone`), or name the folder "
            "with --gpt-fast"
        )
        engines.remove("gpt-fast")
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[tuple, list[dict]] = {}
    for model in args.models.split(","):
        for batch in batches:
            for round_ in range(1, args.rounds + 1):
                for engine in engines if round_ % 2 else engines[::-1]:
                    result = run_one(args, engine, model, batch)
                    results.setdefault((model, batch, engine), []).append(result)
                    said = result.get("error") or (
                        f"step {result['step_ms']:.3f} ms, {result['how']}"
                    )
                    report(f"round {round_} {model} batch {batch} {engine}: {said}")
    body = tables(args, engines, results)
    report("")
    for line in body:
        report(line)
    if args.dry_run:
        failed = [k for k, runs in results.items() if all("error" in r for r in runs)]
        report("dry run: " + (f"FAILED {failed}" if failed else "every engine built and ran"))
        if failed:
            raise SystemExit(1)
        return
    import torch

    command = "python3 scripts/gpu/compare_decode.py " + " ".join(sys.argv[1:])
    header = [
        "# One decode step: gpt-fast, transformers and mini_vllm",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {torch.cuda.get_device_name()}; {versions()}",
        f"- gpt-fast: {gpt_fast_commit(args.gpt_fast) if 'gpt-fast' in engines else 'skipped'}",
        f"- command: `{command.strip()}`",
        f"- work: random weights, bfloat16, a prompt of {args.context} random tokens per "
        f"request; {args.steps} timed decode steps after {args.warmup} warm-up steps; "
        f"{args.rounds} rounds, one fresh process per engine, model and batch, the engines "
        "taking turns (reversed every other round)",
        "- step ms: synchronised wall time, the median gap between consecutive steps' ends (a "
        "step ends when its tokens are on the host), the median over the rounds; spread: "
        "the lowest and highest round",
        f"- back-to-back ms: {args.steps} steps of the decode loop without reading the tokens "
        "on the host, one sync at each end, divided by the steps (gpt-fast's "
        "`decode_n_tokens` and the transformers guide's loop run so; `generate` and mini_vllm "
        "read every step's tokens, mini_vllm's +async modes one step late)",
        "- kernels: GPU kernels of one decode step (torch.profiler); setup s: building the "
        "engine (mini_vllm: graphs captured, compiled) or its first generate runs (compiles)",
        "- sampling: gpt-fast with its generate.py defaults (temperature 0.8, top-k 200); "
        "the others greedy",
        "",
    ]
    text = "\n".join(header + body)
    path = args.out / "compare_decode.md"
    path.write_text(text, encoding="utf-8")
    report(f"wrote {path}")


def dry_run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="unused in a dry run")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.steps, args.warmup, args.rounds = min(args.steps, 3), min(args.warmup, 1), 1
    compare(args, print)
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["one-process"]:
        sys.exit(one_process(argv[1:]))
    if "--dry-run" in argv:
        sys.exit(dry_run(argv))
    sys.exit(run_script(__file__, __doc__.splitlines()[0], compare, add_arguments))
