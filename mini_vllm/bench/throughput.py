"""`bench throughput`: many prompts through `LLM.generate` at once; tokens per second.

vLLM counterpart: vllm/benchmarks/throughput.py (`vllm bench throughput`: a dataset of
prompts through one `LLM.generate` call, printed as "Throughput: N requests/s, N total
tokens/s, N output tokens/s"; `--backend hf` times Hugging Face's `generate` instead) with
the random dataset of vllm/benchmarks/datasets.py (`RandomDataset`).

Two datasets:

- `questions` (the default): a small shipped set of chat questions, greedy, the same
  number of new tokens for each (EOS ignored). transformers' `generate` runs the same
  prompts on the same weights beside it, one after another as a script calling it in a
  loop would, while mini_vllm takes them all at once and batches every step.
- `random`: prompts of token ids below 256 (in every model's vocabulary, so a model
  without a tokenizer serves them too) with lengths drawn as vLLM's random dataset draws
  them: uniform integers from `floor(len * (1 - r))` to `ceil(len * (1 + r))`, seeded. It
  is the sampler of `bench serve` (mini_vllm/bench/serve.py, `sample_requests`). EOS is
  ignored, so every request generates exactly its output length. The transformers side
  is off unless asked for: one prompt at a time, hundreds of long requests take hours.

The preset `nano-vllm` is the offline workload that nano-vllm and mini-sglang compare
engines with: nano-vllm's bench.py, function `main`
(https://github.com/GeeeekExplorer/nano-vllm/blob/bb823b3e06983d71485a8e1f23715ebd87d98ef8/bench.py).
It is 256 requests, prompt and output lengths each uniform over the integers 100 to
1024, EOS ignored, temperature 0.6, random token prompts. In the random dataset's terms that is
`--random-input-len 562 --random-output-len 562 --random-range-ratio 0.821`, exactly:
floor(562 * 0.179) = 100 and ceil(562 * 1.821) = 1024 (every ratio r with
1 - 101/562 < r <= 1 - 100/562, about 0.82028 to 0.82206, gives the same two ends).
nano-vllm draws with Python's `random` (seed 0) and token ids from 0 to 10000; here
numpy's generator and ids below 256 draw another sample of the same distribution (the
ids do not change the work). The preset also sets max_num_seqs=256 and
max_num_batched_tokens=16384 unless they are given: nano-vllm's own defaults are 16384
tokens a step and 512 sequences, which for 256 requests is the same as 256.

Throughput, as vLLM's: requests / wall time, (prompt + output tokens) / wall time and
output tokens / wall time, over the one `generate` call, after a short warm-up.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from mini_vllm.bench.serve import QUESTIONS, random_length_bounds, sample_requests
from mini_vllm.errors import UserError
from mini_vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mini_vllm.llm import LLM

# torch and the engine are imported where they are used: the CLI builds its parser from
# this module's names (DATASETS, PRESETS) without loading torch.

__all__ = [
    "DATASETS",
    "PRESETS",
    "EngineSettings",
    "PublishedAnchor",
    "ThroughputResult",
    "ThroughputWorkload",
    "WorkloadPreset",
    "engine_options",
    "format_throughput_markdown",
    "run_throughput_bench",
]

DATASETS = ("questions", "random")

# Tokens kept for a question's prompt (38 at most with SmolLM2's chat template), so that
# max_model_len can be chosen before the tokenizer is loaded.
QUESTION_PROMPT_ROOM = 128
QUESTIONS_MAX_MODEL_LEN = 512  # at least this, so the default run's KV cache stays as it was


@dataclass(frozen=True)
class ThroughputWorkload:
    """What `bench throughput` serves; the fields are its options."""

    dataset: str = "questions"  # --dataset-name: questions or random
    num_prompts: int = 16  # --num-prompts
    # questions: every prompt's new tokens (--new-tokens); random: the mean of the output
    # lengths (--random-output-len)
    output_len: int = 64
    input_len: int = 128  # random only: the mean prompt length (--random-input-len)
    range_ratio: float = 0.0  # random only (--random-range-ratio)
    seed: int = 0  # --seed: the prompts and their lengths, and the engine's
    temperature: float = 0.0  # --temperature; 0: greedy
    preset: str | None = None  # the preset's name, when the workload is one

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise UserError(f"--dataset-name {self.dataset!r}: use {' or '.join(DATASETS)}")
        if self.num_prompts < 1:
            raise UserError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        output_flag = "--random-output-len" if self.dataset == "random" else "--new-tokens"
        if self.output_len < 1:
            raise UserError(f"{output_flag} must be >= 1, got {self.output_len}")
        if self.input_len < 1:
            raise UserError(f"--random-input-len must be >= 1, got {self.input_len}")
        random_length_bounds(self.input_len, self.range_ratio)  # refuses a ratio outside [0, 1)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(
                f"--temperature must be a finite number >= 0 (0: greedy), got {self.temperature}"
            )

    @property
    def input_bounds(self) -> tuple[int, int]:
        """The shortest and longest prompt the random dataset can draw."""
        return random_length_bounds(self.input_len, self.range_ratio)

    @property
    def output_bounds(self) -> tuple[int, int]:
        """The fewest and most tokens a request generates."""
        if self.dataset == "questions":
            return self.output_len, self.output_len
        return random_length_bounds(self.output_len, self.range_ratio)

    def describe(self) -> str:
        sampling = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}"
        if self.dataset == "questions":
            return (
                f"{self.num_prompts} chat questions, {self.output_len} new tokens each, "
                f"{sampling}, EOS ignored"
            )
        return (
            f"random dataset: {self.num_prompts} prompts of token ids below 256, prompt "
            f"lengths {_lengths(*self.input_bounds)} and output lengths "
            f"{_lengths(*self.output_bounds)} (input len {self.input_len}, output len "
            f"{self.output_len}, range ratio {self.range_ratio:g}), seed {self.seed}, "
            f"{sampling}, EOS ignored"
        )


def _lengths(low: int, high: int) -> str:
    return f"{low}" if low == high else f"uniform in [{low}, {high}]"


@dataclass(frozen=True)
class PublishedAnchor:
    """A published throughput on the same workload, to put a run in context."""

    engine: str
    gpu: str
    model: str
    output_tokens_per_s: float
    source: str  # markdown: a link, or "user report" where no source could be found


@dataclass(frozen=True)
class WorkloadPreset:
    name: str
    workload: ThroughputWorkload
    max_num_seqs: int  # unless --max-num-seqs is given
    max_num_batched_tokens: int  # unless --max-num-batched-tokens is given
    origin: str  # where the workload comes from, in markdown
    anchors: tuple[PublishedAnchor, ...] = ()
    anchor_note: str = ""


_NANO_VLLM_ANCHOR_ISSUE = "https://github.com/cosmoliu2002/nano-vllm-triton/issues/1"
_NANO_VLLM_ANCHOR_SOURCE = f"[user report, nano-vllm-triton issue #1]({_NANO_VLLM_ANCHOR_ISSUE})"

PRESETS = {
    "nano-vllm": WorkloadPreset(
        name="nano-vllm",
        workload=ThroughputWorkload(
            dataset="random",
            num_prompts=256,
            input_len=562,
            output_len=562,
            range_ratio=0.821,  # with 562: exactly 100 to 1024 (see the module docstring)
            seed=0,
            temperature=0.6,
            preset="nano-vllm",
        ),
        max_num_seqs=256,
        max_num_batched_tokens=16384,
        origin="nano-vllm's offline benchmark, [bench.py](https://github.com/GeeeekExplorer/"
        "nano-vllm/blob/bb823b3e06983d71485a8e1f23715ebd87d98ef8/bench.py) `main`, which "
        "mini-sglang's offline benchmark adapts",
        anchors=(
            PublishedAnchor(
                "vLLM 0.10.2",
                "NVIDIA A800-SXM4-80GB",
                "Llama-3.2-1B-Instruct",
                12627.36,
                _NANO_VLLM_ANCHOR_SOURCE,
            ),
            PublishedAnchor(
                "nano-vllm-triton",
                "NVIDIA A800-SXM4-80GB",
                "Llama-3.2-1B-Instruct",
                15068.15,
                _NANO_VLLM_ANCHOR_SOURCE,
            ),
        ),
        anchor_note=(
            "Those runs drew the workload with Python's `random` (seed 0: 133,966 output "
            "tokens in all), this one with numpy: the same distribution, another sample. "
            "The shape that compares with them is `--model llama-3.2-1b-like`."
        ),
    ),
}


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings as the run resolved them (defaults included)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    cudagraph_mode: str
    dtype: str


@dataclass
class ThroughputResult:
    model: str
    device: str
    machine: str  # the GPU's name on CUDA, the processor otherwise
    workload: ThroughputWorkload
    engine: EngineSettings
    prompt_tokens: int
    output_tokens: int
    num_steps: int  # engine steps of the timed call
    ours_s: float
    hf_s: float | None = None  # transformers, one prompt at a time
    same_tokens: int | None = None  # greedy only: prompts whose generated ids are identical

    @property
    def num_prompts(self) -> int:
        return self.workload.num_prompts

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.ours_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.ours_s

    @property
    def requests_per_s(self) -> float:
        return self.num_prompts / self.ours_s

    def hf_rates(self) -> tuple[float, float, float]:
        """transformers' output tokens/s, total tokens/s and requests/s (it generates the
        same lengths: `min_new_tokens` holds it past EOS)."""
        if not self.hf_s:
            return (float("nan"),) * 3
        total = self.prompt_tokens + self.output_tokens
        return self.output_tokens / self.hf_s, total / self.hf_s, self.num_prompts / self.hf_s


def run_throughput_bench(
    model_name: str = "smollm2-135m-instruct",
    device: str = "cpu",
    workload: ThroughputWorkload | None = None,
    dtype: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    with_hf: bool | None = None,
    log=print,
) -> ThroughputResult:
    """Serve `workload` in one `LLM.generate` call and time it.

    `max_num_seqs` and `max_num_batched_tokens`: None leaves the engine's default (or the
    preset's). `with_hf`: None compares with transformers on the questions only.
    """
    workload = workload or ThroughputWorkload()
    if with_hf is None:
        with_hf = workload.dataset == "questions"
    engine_kwargs = engine_options(device, workload, dtype, max_num_seqs, max_num_batched_tokens)

    if workload.dataset == "random":
        log(f"drawing {workload.describe()}")
        requests = sample_requests(
            "random",
            workload.num_prompts,
            workload.input_len,
            workload.output_len,
            workload.range_ratio,
            workload.seed,
        )
        prompts = [list(r.prompt) for r in requests]
        output_lens = [r.output_len for r in requests]
        # The cache is sized for max_model_len, so the longest request sets it.
        max_model_len = max(len(p) + n for p, n in zip(prompts, output_lens))
        _check_fits_the_model(model_name, max_model_len, workload)
        llm = _load(model_name, max_model_len, engine_kwargs, log)
    else:
        needed = QUESTION_PROMPT_ROOM + workload.output_len
        context = _model_context(model_name)
        if needed > context:
            raise UserError(
                f"--new-tokens {workload.output_len} does not fit {model_name!r}, which holds "
                f"{context} positions with up to {QUESTION_PROMPT_ROOM} for the question; "
                f"give --new-tokens <= {context - QUESTION_PROMPT_ROOM}"
            )
        max_model_len = min(context, max(QUESTIONS_MAX_MODEL_LEN, needed))
        llm = _load(model_name, max_model_len, engine_kwargs, log)
        prompts = _question_prompts(llm.tokenizer, workload.num_prompts)
        output_lens = [workload.output_len] * workload.num_prompts

    params = [
        SamplingParams(temperature=workload.temperature, max_tokens=n, ignore_eos=True)
        for n in output_lens
    ]
    log("warm-up: 2 short requests")
    warmup = [p[:16] for p in prompts[:2]]
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(warmup, short, use_tqdm=False)

    prompt_tokens = sum(map(len, prompts))
    log(
        f"mini_vllm: {workload.num_prompts} requests at once ({prompt_tokens} prompt tokens, "
        f"{sum(output_lens)} output tokens) ..."
    )
    steps_before = llm.stats.num_steps
    _synchronize(device)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    _synchronize(device)
    ours_s = time.perf_counter() - start
    failed = [o for o in outputs if not o.ok]
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {len(outputs)} requests did not finish ({failed[0].finish_reason}: "
            f"{failed[0].error}); a throughput over them would count work not done"
        )
    result = ThroughputResult(
        model=model_name,
        device=device,
        machine=_machine(device),
        workload=workload,
        engine=_engine_settings(llm),
        prompt_tokens=prompt_tokens,
        output_tokens=sum(len(o.token_ids) for o in outputs),
        num_steps=llm.stats.num_steps - steps_before,
        ours_s=ours_s,
    )
    log(
        f"mini_vllm: {ours_s:.2f} s, {result.num_steps} steps, "
        f"{result.output_tokens_per_s:.1f} output tokens/s"
    )
    if with_hf:
        _run_transformers(llm, prompts, output_lens, outputs, result, log)
    return result


def engine_options(
    device: str,
    workload: ThroughputWorkload,
    dtype: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, object]:
    """The `LLM` keyword arguments of a run, max_model_len aside. A batch limit not given
    is the preset's, else left out: the engine's own default depends on the device."""
    preset = PRESETS.get(workload.preset) if workload.preset else None
    if preset is not None:
        if max_num_seqs is None:
            max_num_seqs = preset.max_num_seqs
        if max_num_batched_tokens is None:
            max_num_batched_tokens = preset.max_num_batched_tokens
    options: dict[str, object] = {"device": device, "seed": workload.seed}
    if dtype is not None:
        options["dtype"] = dtype
    if max_num_seqs is not None:
        options["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = max_num_batched_tokens
    return options


def _model_context(model_name: str) -> int:
    from mini_vllm.models.loader import load_model_config

    return load_model_config(model_name).max_position_embeddings


def _check_fits_the_model(model_name: str, longest: int, workload: ThroughputWorkload) -> None:
    context = _model_context(model_name)
    if longest > context and workload.preset:
        raise UserError(
            f"--preset {workload.preset} draws requests of up to {longest} tokens but "
            f"{model_name!r} holds {context} positions; run it on a model with a longer "
            "context (smollm2-135m, llama-3.2-1b-like, llama-3.1-8b-like)"
        )
    if longest > context:
        (_, in_high), (_, out_high) = workload.input_bounds, workload.output_bounds
        raise UserError(
            f"the longest request drawn is {longest} tokens (prompts up to {in_high}, outputs "
            f"up to {out_high}) but {model_name!r} holds {context} positions; lower "
            "--random-input-len, --random-output-len or --random-range-ratio"
        )


def _load(model_name: str, max_model_len: int, engine_kwargs: dict, log) -> LLM:
    from mini_vllm.llm import LLM

    log(f"loading {model_name} on {engine_kwargs['device']} (max_model_len={max_model_len}) ...")
    llm = LLM(model_name, max_model_len=max_model_len, **engine_kwargs)
    settings = _engine_settings(llm)
    log(
        f"loaded in {llm.load_seconds:.1f} s: max_num_seqs={settings.max_num_seqs}, "
        f"max_num_batched_tokens={settings.max_num_batched_tokens}, "
        f"cudagraph_mode={settings.cudagraph_mode}, dtype={settings.dtype}"
    )
    return llm


def _question_prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(num_prompts)]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return [
            tokenizer.encode(
                tokenizer.apply_chat_template([{"role": "user", "content": q}]),
                add_special_tokens=False,
            )
            for q in questions
        ]
    if tokenizer is not None:
        return [tokenizer.encode(q) for q in questions]
    # No tokenizer: stand-in prompts of 20 to 35 ids, one length per question.
    return [
        [3 + (7 * i + j) % 200 for j in range(20 + i % len(QUESTIONS))] for i in range(num_prompts)
    ]


def _run_transformers(llm: LLM, prompts, output_lens, outputs, result: ThroughputResult, log):
    """transformers' `generate` on the same weights, one prompt at a time, the same lengths."""
    import torch

    from mini_vllm.bench.harness import transformers_twin

    hf = transformers_twin(llm.engine.model)
    dev = next(hf.parameters()).device
    temperature = result.workload.temperature
    sampling = {"do_sample": True, "temperature": temperature} if temperature else {}
    greedy = not sampling
    same = 0
    report_every = max(1, len(prompts) // 10)
    with torch.inference_mode():
        hf.generate(
            torch.tensor([prompts[0][:16]], device=dev),
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
        )
        log(f"transformers generate: {len(prompts)} prompts, one at a time ...")
        _synchronize(result.device)
        start = time.perf_counter()
        for i, (prompt, new_tokens, ours) in enumerate(zip(prompts, output_lens, outputs), 1):
            out = hf.generate(
                torch.tensor([prompt], device=dev),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                **(sampling or {"do_sample": False}),
            )
            if greedy and out[0, len(prompt) :].tolist() == ours.token_ids:
                same += 1
            if i % report_every == 0 and i < len(prompts):
                log(f"  transformers: {i}/{len(prompts)} prompts")
        _synchronize(result.device)
        result.hf_s = time.perf_counter() - start
    result.same_tokens = same if greedy else None
    log(f"transformers generate, one prompt at a time: {result.hf_s:.2f} s")


def _engine_settings(llm: LLM) -> EngineSettings:
    config = llm.config
    weight_dtype = next(llm.engine.model.parameters()).dtype
    return EngineSettings(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        cudagraph_mode=config.cudagraph_mode.name.lower(),
        dtype=str(weight_dtype).removeprefix("torch."),
    )


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"GPU {torch.cuda.get_device_name(torch.device(device))}"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"


def format_throughput_markdown(result: ThroughputResult, command: str) -> str:
    import torch

    workload, engine = result.workload, result.engine
    if workload.dataset == "questions" and result.hf_s:
        title = "Throughput: continuous batching vs transformers, one prompt at a time"
    else:
        if workload.preset:
            title = f"Throughput: the {workload.preset} offline workload through `LLM.generate`"
        elif workload.dataset == "random":
            title = "Throughput: `LLM.generate` on vLLM's random dataset"
        else:
            title = "Throughput: `LLM.generate` on the shipped questions"
        if result.hf_s:
            title += ", and transformers one prompt at a time"
    lines = [
        f"# {title}",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {result.machine}; torch {torch.__version__}",
        f"- command: `{command}`",
        f"- model: `{result.model}` on {result.device}",
        f"- workload: {workload.describe()}",
    ]
    if workload.preset:
        lines.append(f"- preset `{workload.preset}`: {PRESETS[workload.preset].origin}")
    lines += [
        f"- engine: `max_num_seqs={engine.max_num_seqs}`, "
        f"`max_num_batched_tokens={engine.max_num_batched_tokens}`, "
        f"`max_model_len={engine.max_model_len}`, cudagraph mode `{engine.cudagraph_mode}`, "
        f"dtype {engine.dtype}; all prompts in one `LLM.generate` call",
    ]
    if result.hf_s:
        lines.append("- transformers: `generate` in a loop, one prompt at a time, same weights")
    lines += [
        "",
        "<!-- ANCHOR: throughput -->",
        "| engine | wall s | output tokens/s | total tokens/s | requests/s |",
        "|---|---|---|---|---|",
        f"| mini_vllm `LLM.generate` | {result.ours_s:.2f} | {result.output_tokens_per_s:.1f} | "
        f"{result.total_tokens_per_s:.1f} | {result.requests_per_s:.2f} |",
    ]
    if result.hf_s:
        output_rate, total_rate, request_rate = result.hf_rates()
        lines.append(
            f"| transformers `generate` | {result.hf_s:.2f} | {output_rate:.1f} | "
            f"{total_rate:.1f} | {request_rate:.2f} |"
        )
    lines.append("<!-- ANCHOR_END: throughput -->")
    if result.hf_s:
        lines += ["", f"**ratio: {result.hf_s / result.ours_s:.1f}x**"]
        if result.same_tokens is not None:
            lines += [
                "",
                "identical generated ids on both sides: "
                f"{result.same_tokens} of {result.num_prompts} prompts",
            ]
    lines += [
        "",
        "| prompts | prompt tokens | output tokens | engine steps | wall s |",
        "|---|---|---|---|---|",
        f"| {result.num_prompts} | {result.prompt_tokens} | {result.output_tokens} | "
        f"{result.num_steps} | {result.ours_s:.2f} |",
    ]
    preset = PRESETS.get(workload.preset) if workload.preset else None
    if preset is not None and preset.anchors:
        lines += [
            "",
            "## Published anchors, same workload",
            "",
            "| engine | GPU | model | output tokens/s | source |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {a.engine} | {a.gpu} | {a.model} | {a.output_tokens_per_s:,.0f} | {a.source} |"
            for a in preset.anchors
        ]
        if preset.anchor_note:
            lines += ["", preset.anchor_note]
    return "\n".join(lines) + "\n"
