"""Inter-token latency, eager vs CUDA graphs, across batch sizes: the reference of lab 04.

vLLM counterpart: vllm/benchmarks/latency.py (`vllm bench latency`), which one would
run twice, with and without `--enforce-eager`. The lab times our engine's decode steps
in both modes on a real model shape, tabulates the speed-up per batch size and finds
where graphs stop paying; `python -m mini_vllm.bench.itl --out FILE` records a run as
JSON (the lab ships one from an H100 for readers without a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

from mini_vllm.bench.harness import decode_engine, start_decoding
from mini_vllm.models.loader import load_model
from mini_vllm.utils import synchronize

__all__ = [
    "ITLRow",
    "crossover_batch",
    "decoding_engine",
    "format_table",
    "load_recorded",
    "measure_itl",
    "saving_ms",
    "speedups",
    "time_decode_steps",
    "vllm_available",
    "vllm_itl_ms",
]


@dataclass(frozen=True)
class ITLRow:
    batch: int
    eager_ms: float  # median inter-token latency, eager
    graph_ms: float  # median inter-token latency, CUDA graphs

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.graph_ms


# ANCHOR: time_decode_steps
def time_decode_steps(engine, steps: int = 20, warmup: int = 3) -> list[float]:
    """Seconds of each of `steps` engine steps, after `warmup` untimed ones.

    GPU work is asynchronous, so the clock is read only after the device has finished
    (`torch.cuda.synchronize`); without it a step would seem to end when its kernels
    are *launched*, which is exactly the part graphs remove.
    """
    device = engine.runner.device
    for _ in range(warmup):
        engine.step()
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        engine.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


# ANCHOR_END: time_decode_steps


def decoding_engine(model, batch: int, context_len: int, steps: int, mode: str):
    """An engine (see mini_vllm/bench/harness.py) whose next `steps` steps decode `batch`
    requests at once, each step on the graph captured for `batch` (mode "eager": none)."""
    engine = decode_engine(model, mode, [batch], context_len, new_tokens=steps)
    start_decoding(engine, batch, context_len, new_tokens=steps)
    return engine


def measure_itl(
    model_name: str = "smollm2-135m",
    device: str = "cuda",
    batch_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
    steps: int = 20,
    context_len: int = 128,
    graph_mode: str = "full_and_piecewise",
) -> list[ITLRow]:
    """Median inter-token latency per batch size, eager and with graphs, same weights."""
    model, _, _ = load_model(model_name, device=device, progress=False)
    rows = []
    for batch in batch_sizes:
        medians = {}
        for graphs in (False, True):
            engine = decoding_engine(
                model, batch, context_len, steps + 5, graph_mode if graphs else "eager"
            )
            medians[graphs] = (
                statistics.median(time_decode_steps(engine, steps=steps, warmup=3)) * 1000
            )
            del engine
        rows.append(ITLRow(batch, eager_ms=medians[False], graph_ms=medians[True]))
    return rows


def speedups(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms / graph ms}."""
    return {row.batch: row.eager_ms / row.graph_ms for row in rows}


def saving_ms(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms - graph ms}: what graphs save per token, mostly launch time.

    It stays roughly constant as the batch grows, while the step itself grows: that
    is why the *ratio* falls (invariant 1: graphs remove launches, not GPU work).
    """
    return {row.batch: row.eager_ms - row.graph_ms for row in rows}


# ANCHOR: crossover_batch
def crossover_batch(rows: Iterable[ITLRow], threshold: float = 1.05) -> int | None:
    """The smallest measured batch size at which graphs gain less than `threshold`×."""
    for row in sorted(rows, key=lambda r: r.batch):
        if row.eager_ms / row.graph_ms < threshold:
            return row.batch
    return None


# ANCHOR_END: crossover_batch


def format_table(rows: Iterable[ITLRow]) -> str:
    lines = ["| batch | eager ms/token | graph ms/token | speed-up |", "|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r.batch):
        lines.append(
            f"| {row.batch} | {row.eager_ms:.3f} | {row.graph_ms:.3f} | {row.speedup:.2f}x |"
        )
    return "\n".join(lines)


def load_recorded(path: str | Path) -> tuple[dict, list[ITLRow]]:
    """(metadata, rows) of a run recorded with `python -m mini_vllm.bench.itl --out`."""
    data = json.loads(Path(path).read_text())
    return data["meta"], [ITLRow(**row) for row in data["rows"]]


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_itl_ms(
    model_dir: str,
    enforce_eager: bool,
    batch: int = 1,
    new_tokens: int = 64,
    context_len: int = 128,
) -> float:
    """Median ms per generated token of real vLLM on `model_dir`, with or without graphs.

    One `vllm.LLM` per call (vLLM decides eager vs graphs at start-up); the time of a
    1-token run is subtracted so that prefill does not count.
    """
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        enforce_eager=enforce_eager,
        max_model_len=context_len + new_tokens + 8,
        gpu_memory_utilization=0.3,
        max_num_seqs=max(batch, 1),
        skip_tokenizer_init=True,
    )
    prompts = [
        {"prompt_token_ids": [5 + (i * 13 + j) % 1000 for j in range(context_len)]}
        for i in range(batch)
    ]

    def run(n: int) -> float:
        start = time.perf_counter()
        llm.generate(
            prompts,
            SamplingParams(
                max_tokens=n, min_tokens=n, temperature=0, ignore_eos=True, detokenize=False
            ),
            use_tqdm=False,
        )
        return time.perf_counter() - start

    run(4)
    return (
        (
            statistics.median(run(new_tokens) for _ in range(3))
            - statistics.median(run(1) for _ in range(3))
        )
        / (new_tokens - 1)
        * 1000
    )


def _main() -> None:
    parser = argparse.ArgumentParser(
        description="Record eager vs graph inter-token latency across batch sizes."
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    rows = measure_itl(args.model, args.device, batch_sizes, args.steps)
    meta = {
        "date": date.today().isoformat(),
        "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "dtype": "bfloat16" if args.device.startswith("cuda") else "float32",
        "context_len": 128,
        "command": f"python -m mini_vllm.bench.itl --model {args.model} --device {args.device} "
        f"--batch-sizes {args.batch_sizes} --steps {args.steps} --out {args.out}",
    }
    Path(args.out).write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    print(format_table(rows))
    print(f"crossover (speed-up < 1.05x): {crossover_batch(rows)}")


if __name__ == "__main__":
    _main()
