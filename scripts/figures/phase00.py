#!/usr/bin/env python3
"""Draw the figure of the Phase 00 chapter from a recorded run of the decode loop.

    .venv/bin/python scripts/figures/phase00.py              # the figure into book/src/figures/
    .venv/bin/python scripts/figures/phase00.py --only prefill-then-decode.png --out-dir /tmp
    .venv/bin/python scripts/figures/phase00.py --record     # re-measure (about a minute)

The numbers come from benchmarks/results/decode-steps-cpu.md: SmolLM2-135M-Instruct run
by `mini_vllm.teaching.decode_loop.generate` on the CPU, every step's time kept (the TTFT
and each inter-token gap), plus a sweep over prompt lengths. `--record` makes that file
again on this machine (it loads the real model and times it, so the numbers are this
machine's); drawing only reads it, which keeps the PNG deterministic. Same pattern as
scripts/figures/phase06.py: one function a figure, a fixed style, a `FIGURES` dict.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

import numpy as np
from figurekit import ROOT, styled  # also puts the checkout on sys.path
from figurekit import draw as _draw
from matplotlib.figure import Figure

__all__ = [
    "FIGURES",
    "RESULTS_FILE",
    "prefill_then_decode_figure",
    "read_anchored_tables",
    "record",
]

RESULTS_FILE = ROOT / "benchmarks" / "results" / "decode-steps-cpu.md"
MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
NEW_TOKENS = 64
REPEATS = 5
SWEEP_LENGTHS = (16, 64, 128, 256, 512)
SWEEP_NEW_TOKENS = 8
FILLER = "The quick brown fox jumps over the lazy dog. " * 80
_TTFT_COLOR = "#c0392b"
_ITL_COLOR = "#2471a3"


def read_anchored_tables(path: str | Path) -> dict[str, list[dict[str, str]]]:
    """Every pipe table between `<!-- ANCHOR: name -->` and `<!-- ANCHOR_END: name -->`
    of a markdown file, as {name: one dict per row, keyed by the header}."""
    text = Path(path).read_text(encoding="utf-8")
    tables = {}
    for match in re.finditer(
        r"<!-- ANCHOR: (\w+) -->\n(.*?)<!-- ANCHOR_END: \1 -->", text, flags=re.S
    ):
        lines = [line.strip() for line in match.group(2).splitlines() if line.startswith("|")]
        if len(lines) < 3:
            continue
        header = [cell.strip() for cell in lines[0].strip("|").split("|")]
        tables[match.group(1)] = [
            dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            for line in lines[2:]
        ]
    return tables


@styled
def prefill_then_decode_figure(path: str | Path = RESULTS_FILE) -> Figure:
    """Left: the time before each token of one 64-token request (a prefill spike, then
    flat decode steps). Right: TTFT and the decode step against the prompt's length."""
    tables = read_anchored_tables(path)
    steps = tables["every_step"]
    sweep = tables["prompt_sweep"]
    repeats = [key for key in steps[0] if key.startswith("repeat")]
    fig = Figure(figsize=(7.8, 3.6))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1.35, 1)})
    tokens = [int(row["token"]) for row in steps]
    times = np.array([[float(row[key]) for key in repeats] for row in steps])
    ordered = np.sort(times, axis=1)
    middle = ordered[:, 1:-1] if len(repeats) >= 3 else ordered  # without the extremes
    left.fill_between(
        tokens,
        middle.min(axis=1),
        middle.max(axis=1),
        color=_ITL_COLOR,
        alpha=0.25,
        lw=0,
        label=f"middle {middle.shape[1]} of {len(repeats)} repeats",
    )
    left.plot(
        tokens, np.median(times, axis=1), ".-", color=_ITL_COLOR, lw=0.9, ms=3, label="median"
    )
    ttft = float(np.median(times[0]))
    left.annotate(
        "token 1: TTFT\n(prefill of the prompt\n+ first sample)",
        xy=(1, ttft),
        xytext=(9, ttft * 0.9),
        fontsize=8,
        va="top",
        arrowprops={"arrowstyle": "->", "lw": 0.8},
    )
    itl = float(np.median(times[1:]))
    left.text(
        tokens[-1],
        itl * 1.45,
        f"tokens 2-{tokens[-1]}: one decode step each\n(median {itl:.1f} ms)",
        ha="right",
        fontsize=8,
    )
    left.set_ylim(0, ttft * 1.15)
    left.set_xlim(0, tokens[-1] + 1)
    left.set_xlabel("token of the answer")
    left.set_ylabel("time before this token (ms)")
    prompt_tokens = steps[0]["prompt tokens"]
    left.set_title(f"One request: {prompt_tokens}-token prompt, {tokens[-1]} new tokens")
    left.legend(loc="upper right", frameon=False)
    lengths = [int(row["prompt tokens"]) for row in sweep]
    right.plot(
        lengths,
        [float(row["TTFT ms"]) for row in sweep],
        "o-",
        color=_TTFT_COLOR,
        label="TTFT (prefill + first sample)",
    )
    right.plot(
        lengths,
        [float(row["mean ITL ms"]) for row in sweep],
        "s-",
        color=_ITL_COLOR,
        label="mean inter-token latency",
    )
    right.set_xlabel("prompt length (tokens)")
    right.set_ylabel("ms (median of the repeats)")
    right.set_title("TTFT grows with the prompt,\nthe decode step barely moves")
    right.legend(loc="upper left", frameon=False)
    right.set_ylim(0, None)
    fig.suptitle(
        "SmolLM2-135M-Instruct, float32, mini_vllm's decode loop on a CPU "
        f"(benchmarks/results/{Path(path).name})",
        fontsize=8,
        y=0.02,
        va="bottom",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "prefill-then-decode.png": prefill_then_decode_figure,
}


# -- recording ---------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def record(out: Path = RESULTS_FILE, log=print) -> Path:
    """Time the decode loop on the real model and write the results file."""
    import torch

    from mini_vllm.models.loader import load_model
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.teaching.decode_loop import generate

    load_at_start = os.getloadavg()[0]
    command = [sys.executable, "-m", "mini_vllm", "generate", QUESTION, "--chat"]
    cli = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    model, tokenizer, _ = load_model(MODEL, device="cpu", dtype=torch.float32, progress=False)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])
    prompt = tokenizer.encode(chat, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    generate(model, prompt, params)  # warm-up
    runs = []
    for i in range(REPEATS):
        runs.append(generate(model, prompt, params))
        run = runs[-1]
        log(f"repeat {i + 1}: TTFT {_ms(run.ttft_s)} ms, mean ITL {_ms(run.mean_itl_s)} ms")

    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    sweep_params = SamplingParams(temperature=0.0, max_tokens=SWEEP_NEW_TOKENS, ignore_eos=True)
    for n in SWEEP_LENGTHS:
        generate(model, filler[:n], sweep_params)  # warm-up at each length
    # Round-robin over the lengths, so that a burst of load from a neighbour spreads
    # over all of them instead of spoiling every repeat of one.
    by_length = {n: [] for n in SWEEP_LENGTHS}
    for _ in range(REPEATS):
        for n in SWEEP_LENGTHS:
            by_length[n].append(generate(model, filler[:n], sweep_params))
    sweep = []
    for n, results in by_length.items():
        ttft = statistics.median(r.ttft_s for r in results)
        itl = statistics.median(r.mean_itl_s for r in results)
        sweep.append((n, ttft, itl))
        log(f"prompt {n}: TTFT {_ms(ttft)} ms, mean ITL {_ms(itl)} ms")

    load_at_end = os.getloadavg()[0]

    lines = [
        "# The decode loop, step by step: SmolLM2-135M-Instruct on CPU",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {os.cpu_count()}-core CPU; {platform.processor() or platform.machine()}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads",
        "- command: `.venv/bin/python scripts/figures/phase00.py --record`",
        f"- model: `{MODEL}`, float32, batch 1, greedy, EOS ignored; mini_vllm's decode loop "
        "(`generate` in `mini_vllm/teaching/decode_loop.py`)",
        f'- one request: the {len(prompt)}-token chat prompt ("{QUESTION}"), {NEW_TOKENS} new '
        f"tokens, 1 warm-up + {REPEATS} timed repeats",
        f"- prompt sweep: prompts cut from one repeated English sentence, {SWEEP_NEW_TOKENS} new "
        f"tokens each, 1 warm-up + {REPEATS} repeats a length (taken in turn over the lengths), "
        "medians reported",
        "- the figure draws, for each token, the median of the repeats and the range of the",
        "  middle three, so that a step slowed by a neighbour does not hide the shape",
        "- token 1's time is the TTFT (cache allocation, prefill and the first sample); token k's,",
        "  for k > 1, is the gap since token k - 1: one decode step and its sample",
        f"- load average of this shared VM: {load_at_start:.2f} at the start, {load_at_end:.2f} at "
        "the end; its speed drifts by tens of percent with its neighbours' load",
        "",
        "One request, each repeat:",
        "",
        "<!-- ANCHOR: one_request -->",
        "| repeat | TTFT ms | ITL ms, median | ITL ms, min | ITL ms, max "
        "| tokens/s (whole request) |",
        "|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(runs, 1):
        lines.append(
            f"| {i} | {_ms(run.ttft_s)} | {_ms(statistics.median(run.itl_s))} | "
            f"{_ms(min(run.itl_s))} | {_ms(max(run.itl_s))} | {run.tokens_per_s:.1f} |"
        )
    lines += [
        "<!-- ANCHOR_END: one_request -->",
        "",
        "Prompt length against TTFT and the decode step (medians of the repeats):",
        "",
        "<!-- ANCHOR: prompt_sweep -->",
        "| prompt tokens | TTFT ms | prefill tokens/s | mean ITL ms | decode tokens/s |",
        "|---|---|---|---|---|",
    ]
    for n, ttft, itl in sweep:
        lines.append(f"| {n} | {_ms(ttft)} | {n / ttft:.0f} | {_ms(itl)} | {1 / itl:.1f} |")
    lines += [
        "<!-- ANCHOR_END: prompt_sweep -->",
        "",
        f'`python -m mini_vllm generate "{QUESTION}" --chat`, run once before the '
        "timings, printed:",
        "",
        "<!-- ANCHOR: generate_cli -->",
        "```text",
        *[line for line in cli.stdout.strip().splitlines() if line.strip()],
        "```",
        "<!-- ANCHOR_END: generate_cli -->",
        "",
        "Every step of the one request, in ms (what `scripts/figures/phase00.py` draws):",
        "",
        "<!-- ANCHOR: every_step -->",
        "| token | prompt tokens | "
        + " | ".join(f"repeat {i} ms" for i in range(1, REPEATS + 1))
        + " |",
        "|---|---|" + "---|" * REPEATS,
    ]
    for k in range(NEW_TOKENS):
        times = [run.ttft_s if k == 0 else run.itl_s[k - 1] for run in runs]
        lines.append(f"| {k + 1} | {len(prompt)} | " + " | ".join(_ms(t) for t in times) + " |")
    lines += ["<!-- ANCHOR_END: every_step -->", ""]
    out.write_text("\n".join(lines), encoding="utf-8")
    log(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--record", action="store_true")
    known, rest = parser.parse_known_args(argv)
    if known.record:
        record()
        return 0
    description = (
        __doc__.splitlines()[0] + " (--record: time the decode loop again and rewrite "
        "benchmarks/results/decode-steps-cpu.md, about a minute on a 2-core CPU)"
    )
    return _draw(FIGURES, description, rest)


if __name__ == "__main__":
    sys.exit(main())
