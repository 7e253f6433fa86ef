"""`python -m mini_vllm generate "PROMPT" ["PROMPT" ...]`: generate, and report latencies.

vLLM counterpart: examples/offline_inference/basic/generate.py with
vllm/entrypoints/llm.py (`LLM.generate`, `LLM.chat`). With one prompt this runs Phase
00's decode loop (mini_vllm/teaching/decode_loop.py), prints the text as it is produced, then
TTFT, the mean inter-token latency and tokens/s. With several prompts it serves them
all at once through the engine (`mini_vllm.LLM`: paged KV cache, continuous batching)
and prints each answer with its finish reason, then the engine's statistics.

What it is doing goes to stderr, so that stdout holds only the answers: with several
prompts a line when loading and generating start, and with any number a line every few
seconds while either lasts (the first load on a busy machine can take minutes).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mini_vllm.cli.options import model_options, option

HEARTBEAT_S = 5.0  # while loading or generating, a progress line at least this often


def say(line: str) -> None:
    """A progress line on stderr, drawn above any progress bar (the weights' conversion)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


@contextmanager
def heartbeat(
    what: str, detail: Callable[[], str] = lambda: "", every_s: float | None = None
) -> Iterator[None]:
    """While the block runs, a line on stderr every `every_s` seconds (HEARTBEAT_S by
    default): what it is doing, for how long, and `detail()`."""
    every_s = HEARTBEAT_S if every_s is None else every_s
    start = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            extra = detail()
            seconds = time.perf_counter() - start
            say(f"  {what}: {seconds:.0f} s" + (f", {extra}" if extra else ""))

    thread = threading.Thread(target=beat, name="generate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def finish_note(reason: str, max_tokens: int) -> str:
    """What a finish reason means, for a reader who has not met them yet."""
    notes = {
        "stop": "the model ended its answer",
        "length": f"cut at the token limit, --max-tokens {max_tokens}",
    }
    return f"{reason} ({notes[reason]})" if reason in notes else reason


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text: one prompt with the decode loop, several at once with the engine",
        description="Generate a completion for PROMPT, streaming it, then print TTFT, mean "
        "inter-token latency and tokens/s. Several prompts are served together "
        "by the engine (continuous batching), which then prints its statistics.",
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="several: batched by the engine")
    model_options(p)
    option(p, "--chat", "wrap the prompt in the chat template, as a user turn", action="store_true")
    option(p, "--max-tokens", "new tokens at most", type=int, default=64)
    option(p, "--temperature", "0 = greedy", type=float, default=0.0)
    option(p, "--top-k", "keep the k most likely tokens (-1: off)", type=int, default=-1)
    option(
        p, "--top-p", "keep the most likely tokens up to this probability", type=float, default=1.0
    )
    option(p, "--seed", "seed of this request's sampling generator", type=int)
    option(p, "--ignore-eos", "keep generating past the end-of-sequence token", action="store_true")
    option(p, "--enforce-eager", "several prompts on a GPU: no CUDA graphs", action="store_true")


def run(args: argparse.Namespace) -> int:
    from mini_vllm.errors import UserError

    several = len(args.prompts) > 1
    if several:
        say(f"loading {args.model} ...")
    start = time.perf_counter()
    with heartbeat(f"loading {args.model}"):
        params, model, tokenizer, config = _load(args)
    if several:
        say(f"loaded in {time.perf_counter() - start:.1f} s")

    from mini_vllm.teaching.decode_loop import generate
    from mini_vllm.tokenizer import default_tokenizer

    if tokenizer is None:
        print(
            f"note: {args.model} has no tokenizer of its own (random "
            "weights); using raw UTF-8 bytes as tokens, so the output is noise",
            file=sys.stderr,
        )
        tokenizer = default_tokenizer(config)
    if args.chat and not tokenizer.chat_template:
        raise UserError(f"--chat needs a chat template, and {args.model} has none; drop --chat")

    def encode(prompt: str) -> list[int]:
        if args.chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(prompt)
        if max(ids, default=0) >= config.vocab_size:
            raise UserError(
                f"the prompt has token ids beyond this model's vocabulary of {config.vocab_size}"
            )
        return ids

    all_ids = [encode(p) for p in args.prompts]
    if len(all_ids) > 1:
        return _serve_many(args, model, tokenizer, all_ids, params)
    prompt_ids = all_ids[0]
    if not prompt_ids:
        raise UserError("the prompt is empty: give at least one character")

    def stream(_token_id: int, delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    result = generate(model, prompt_ids, params, tokenizer=tokenizer, on_token=stream)
    print()
    print(
        f"[{result.num_generated} tokens, finish: {result.finish_reason}] "
        f"TTFT: {result.ttft_s * 1e3:.1f} ms | mean inter-token latency: "
        f"{result.mean_itl_s * 1e3:.1f} ms | tokens/s: {result.tokens_per_s:.1f}"
    )
    return 0


def _load(args: argparse.Namespace):
    """The sampling parameters from the flags (checked first), then the model: torch's
    import, and on the first run the weights' conversion, take the time."""
    from mini_vllm.errors import UserError
    from mini_vllm.models.loader import load_model, resolve_device
    from mini_vllm.sampling_params import SamplingParams

    # The sampling flags are SamplingParams' fields, by the same names; its message
    # starts with the field's name, which gives the flag to point at.
    sampling = ("temperature", "top_k", "top_p", "max_tokens", "seed", "ignore_eos")
    try:
        params = SamplingParams(**{name: getattr(args, name) for name in sampling})
    except UserError as exc:
        field = str(exc).split()[0]
        raise UserError(f"--{field.replace('_', '-')}: {exc}") from None
    resolve_device(args.device)  # fail on a missing GPU before loading anything
    model, tokenizer, config = load_model(args.model, device=args.device, dtype=args.dtype, seed=0)
    return params, model, tokenizer, config


def _serve_many(args, model, tokenizer, all_ids: list[list[int]], params) -> int:
    """Several prompts: one engine, continuous batching, answers in prompt order."""
    from mini_vllm.llm import LLM

    # A prompt longer than the model's context fails alone, its reason printed in its
    # place; the others are still answered. The engine's max_model_len is sized to what
    # the fitting prompts need, which keeps the KV cache small.
    limit = model.config.max_position_embeddings
    fits = [i for i, ids in enumerate(all_ids) if len(ids) < limit]
    errors = {
        i: f"the prompt is {len(ids)} tokens but the model's context limit is {limit} tokens"
        for i, ids in enumerate(all_ids)
        if len(ids) >= limit
    }
    outputs, seconds, llm = {}, 0.0, None
    if fits:
        llm = LLM.from_model(
            model,
            tokenizer,
            model=args.model,
            max_num_seqs=len(fits),
            max_model_len=min(limit, max(len(all_ids[i]) for i in fits) + params.max_tokens),
            enforce_eager=args.enforce_eager,
        )
        say(f"generating {len(fits)} answers together, at most {params.max_tokens} tokens each ...")
        start = time.perf_counter()
        progress = llm.stats  # read by the heartbeat's thread: counts only
        with heartbeat(
            "generating",
            lambda: f"{progress.num_steps} steps, {progress.decode_tokens} tokens decoded so far",
        ):
            served = llm.generate([all_ids[i] for i in fits], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        outputs = dict(zip(fits, served))
    failed = 0
    for i, prompt in enumerate(args.prompts):
        print(f"--- [{i + 1}] {prompt}")
        output = outputs.get(i)
        if output is not None and output.ok:
            print(output.text.strip())
            note = finish_note(output.finish_reason, params.max_tokens)
            print(f"[{len(output.token_ids)} tokens, finish: {note}]")
        else:
            failed += 1
            print(f"(failed: {errors.get(i) or output.error})")
    generated = sum(len(o.token_ids) for o in outputs.values())
    print(
        f"\n[{len(args.prompts) - failed} prompts served together: {generated} tokens in "
        f"{seconds:.2f} s, {generated / max(seconds, 1e-9):.1f} tokens/s]"
    )
    if llm is not None:
        print(llm.stats.format())
    if failed:
        print(f"error: {failed} of {len(args.prompts)} prompts failed (see above)", file=sys.stderr)
        return 1
    return 0
