"""`bench throughput`: the engine's continuous batching against transformers, one prompt at a time.

vLLM counterpart: vllm/benchmarks/throughput.py (`vllm bench throughput`: many prompts
at once through `LLM.generate`, total tokens over wall time), which compares against
Hugging Face's `generate` with `--backend hf`.

Both sides get the same prompts, the same weights, greedy decoding and the same number of
new tokens per prompt (EOS ignored), in one process. transformers runs them one after
another, as a script calling `generate` in a loop would; mini_vllm takes them all at once
and batches every step. Throughput = generated tokens / wall time.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from datetime import date

import torch

from mini_vllm.bench.harness import transformers_twin
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams

__all__ = ["ThroughputResult", "format_throughput_markdown", "run_throughput_bench"]

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "What is a prime number?",
    "Give three tips for learning to code.",
    "Why is the sky blue?",
    "What does a CPU do?",
    "Summarise the plot of Hamlet.",
    "How do vaccines work?",
    "What is the Pythagorean theorem?",
    "Describe a cat to a child.",
    "What is machine learning?",
    "How far is the Moon?",
    "Name the planets of the solar system.",
    "What causes the seasons?",
    "How do I boil an egg?",
]


@dataclass
class ThroughputResult:
    model: str
    device: str
    num_prompts: int
    new_tokens: int
    prompt_tokens: int
    ours_s: float
    hf_s: float | None
    max_num_seqs: int
    same_tokens: int | None = None  # prompts whose generated ids are identical on both sides

    @property
    def ours_tokens_per_s(self) -> float:
        return self.num_prompts * self.new_tokens / self.ours_s

    @property
    def hf_tokens_per_s(self) -> float:
        return self.num_prompts * self.new_tokens / self.hf_s if self.hf_s else float("nan")


def run_throughput_bench(
    model_name: str = "smollm2-135m-instruct",
    device: str = "cpu",
    num_prompts: int = 16,
    new_tokens: int = 64,
    max_num_seqs: int = 16,
    with_hf: bool = True,
    log=print,
) -> ThroughputResult:
    llm = LLM(model_name, device=device, max_num_seqs=max_num_seqs, max_model_len=512)
    tokenizer = llm.tokenizer
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(num_prompts)]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        prompts = [
            tokenizer.encode(
                tokenizer.apply_chat_template([{"role": "user", "content": q}]),
                add_special_tokens=False,
            )
            for q in questions
        ]
    elif tokenizer is not None:
        prompts = [tokenizer.encode(q) for q in questions]
    else:
        prompts = [[3 + (7 * i + j) % 200 for j in range(20 + i)] for i in range(num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(
        prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )  # warm-up

    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    ours_s = time.perf_counter() - start
    log(f"mini_vllm, {num_prompts} prompts at once: {ours_s:.2f} s ({llm.stats.num_steps} steps)")

    result = ThroughputResult(
        model_name,
        device,
        num_prompts,
        new_tokens,
        sum(map(len, prompts)),
        ours_s,
        None,
        max_num_seqs,
    )
    if with_hf:
        hf = transformers_twin(llm.engine.model)
        dev = next(hf.parameters()).device
        same = 0
        with torch.inference_mode():
            hf.generate(
                torch.tensor([prompts[0]], device=dev),
                max_new_tokens=4,
                do_sample=False,
                pad_token_id=0,
            )
            start = time.perf_counter()
            for prompt, ours in zip(prompts, outputs):
                out = hf.generate(
                    torch.tensor([prompt], device=dev),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
                same += out[0, len(prompt) :].tolist() == ours.token_ids
            result.hf_s = time.perf_counter() - start
        result.same_tokens = same
        log(f"transformers generate, one prompt at a time: {result.hf_s:.2f} s")
    return result


def format_throughput_markdown(result: ThroughputResult, command: str) -> str:
    lines = [
        "# Throughput: continuous batching vs transformers, one prompt at a time",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {platform.machine()}, {torch.get_num_threads()} "
        f"torch threads available; torch {torch.__version__}",
        f"- command: `{command}`",
        f"- model: `{result.model}` on {result.device}; {result.num_prompts} "
        f"chat prompts ({result.prompt_tokens} prompt tokens in "
        f"all), {result.new_tokens} new tokens each, greedy, EOS ignored",
        "- mini_vllm: all prompts at once, "
        f"`max_num_seqs={result.max_num_seqs}`; transformers: `generate` in a loop",
        "",
        "| engine | wall s | generated tokens/s |",
        "|---|---|---|",
        f"| mini_vllm `LLM.generate` | {result.ours_s:.2f} | {result.ours_tokens_per_s:.1f} |",
    ]
    if result.hf_s:
        lines.append(
            f"| transformers `generate` | {result.hf_s:.2f} | {result.hf_tokens_per_s:.1f} |"
        )
        lines += [
            "",
            f"**ratio: {result.ours_tokens_per_s / result.hf_tokens_per_s:.1f}x**",
            "",
            "identical generated ids on both sides: "
            f"{result.same_tokens} of {result.num_prompts} prompts",
        ]
    return "\n".join(lines) + "\n"
