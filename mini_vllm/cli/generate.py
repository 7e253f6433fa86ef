"""`python -m mini_vllm generate "PROMPT"`: stream one completion and report its latencies.

vLLM counterpart: examples/offline_inference/basic/generate.py with
vllm/entrypoints/llm.py (`LLM.generate`, `LLM.chat`). This command runs Phase 00's
decode loop (mini_vllm/decode_loop.py) on one prompt, prints the text as it is
produced, then TTFT, the mean inter-token latency and tokens/s.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text for one prompt with the Phase 00 decode loop",
        description="Generate a completion for PROMPT, streaming it, then print TTFT, mean inter-token "
                    "latency and tokens/s.",
    )
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as a user turn")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k most likely tokens (-1: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the smallest set with this much probability (1: off)")
    p.add_argument("--seed", type=int, default=None, help="seed of this request's sampling generator")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="smollm2-135m-instruct (real weights, default), tiny, smollm2-135m, llama-3.2-1b-like "
                        "(random weights), or a Hugging Face model directory")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")


def run(args: argparse.Namespace) -> int:
    from mini_vllm.errors import UserError
    from mini_vllm.models.loader import resolve_device
    from mini_vllm.sampling_params import SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_tokens, seed=args.seed, ignore_eos=args.ignore_eos)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    resolve_device(args.device)  # fail on a missing GPU before loading anything

    from mini_vllm.decode_loop import generate
    from mini_vllm.models.loader import load_model
    from mini_vllm.tokenizer import default_tokenizer

    model, tokenizer, config = load_model(args.model, device=args.device, dtype=args.dtype, seed=0)
    if tokenizer is None:
        print(f"note: {args.model} has no tokenizer of its own (random weights); using raw UTF-8 bytes as "
              "tokens, so the output is noise", file=sys.stderr)
        tokenizer = default_tokenizer(config)
    if args.chat:
        if not tokenizer.chat_template:
            raise UserError(f"--chat needs a chat template, and {args.model} has none; drop --chat")
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = tokenizer.encode(args.prompt)
    if max(prompt_ids, default=0) >= config.vocab_size:
        raise UserError(f"the prompt has token ids beyond this model's vocabulary of {config.vocab_size}")

    def stream(_token_id: int, delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    result = generate(model, prompt_ids, params, tokenizer=tokenizer, on_token=stream)
    print()
    print(
        f"[{result.num_generated} tokens, finish: {result.finish_reason}] "
        f"TTFT: {result.ttft_s * 1e3:.1f} ms | "
        f"mean inter-token latency: {result.mean_itl_s * 1e3:.1f} ms | "
        f"tokens/s: {result.tokens_per_s:.1f}"
    )
    return 0
