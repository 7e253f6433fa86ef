"""Choose a CUDA-graph capture ladder from a recorded batch-size trace, and score it.

vLLM counterpart: vLLM does not choose its ladder from traffic; it takes
`cudagraph_capture_sizes` (or builds the default in vllm/config/vllm.py,
`VllmConfig._set_cudagraph_sizes`) and `max_cudagraph_capture_size` from
vllm/config/compilation.py, and captures them all in
vllm/v1/worker/gpu_model_runner.py (`GPUModelRunner.capture_model`) before serving.
What it does give is the accounting to judge a ladder with: per step, the unpadded and
padded token counts and the runtime mode (vllm/compilation/cuda_graph.py,
`CUDAGraphStat`). This module closes that loop the way an operator would:

1. record a trace of decode batch sizes from a real run (`record_trace`, or
   `trace_from_stats` on any engine's `EngineStats`);
2. score a ladder on it (`evaluate_ladder`) and check the score with the engine's own
   dispatcher and `EngineStats` (`score_with_engine`);
3. choose the ladder with the least padding that keeps the decode graph hit rate above
   a threshold with at most N graphs (`choose_ladder`).

    .venv/bin/python -m mini_vllm.bench.ladder \
        --out labs/phase-06/lab-01-capture-ladder/data/trace.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mini_vllm.config.capture_sizes import padding_waste
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.engine.stats import EngineStats, StepRecord
from mini_vllm.errors import UserError
from mini_vllm.llm import LLM
from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams

__all__ = [
    "LadderScore",
    "RecordedRun",
    "Request",
    "choose_ladder",
    "evaluate_ladder",
    "load_trace",
    "make_workload",
    "powers_of_two_ladder",
    "record_trace",
    "run_workload",
    "save_trace",
    "score_with_engine",
    "trace_from_stats",
    "tradeoff",
]

DEFAULT_MIN_HIT_RATE = 0.92  # a case study's hit-rate threshold (it alerts below 0.85)


# --- 1. The trace ------------------------------------------------------------------


# ANCHOR: trace_from_stats
def trace_from_stats(stats: EngineStats) -> list[int]:
    """The decode batch sizes of a run, in step order: what a ladder must serve.

    Only uniform-decode steps count (every row decodes one token): they are the steps
    `decode_graph_hit_rate` is measured on. A step's size is its token count, which is
    also its row count when each row decodes one token.
    """
    return [s.num_tokens for s in stats.steps if s.uniform_decode]


# ANCHOR_END: trace_from_stats


def _histogram(trace: Mapping[int, int] | Iterable[int]) -> Counter:
    counts = (
        Counter({int(k): int(v) for k, v in trace.items()})
        if isinstance(trace, Mapping)
        else Counter(int(b) for b in trace)
    )
    bad = sorted(k for k, v in counts.items() if v and k < 1)
    if bad:
        raise UserError(f"batch sizes are >= 1, got {bad}")
    return Counter({k: v for k, v in counts.items() if v > 0})


# --- 2. Scoring a ladder -------------------------------------------------------------


# ANCHOR: ladder_score
@dataclass(frozen=True)
class LadderScore:
    """What a ladder does to a trace of decode steps."""

    ladder: tuple[int, ...]  # the rungs, ascending
    decode_steps: int  # steps in the trace
    graph_steps: int  # steps at or below the top rung: they replay a graph
    real_tokens: int  # tokens the steps held
    padding_tokens: int  # tokens added to reach a rung (steps above the ladder add none)

    @property
    def num_graphs(self) -> int:
        return len(self.ladder)

    @property
    def hit_rate(self) -> float:
        """Share of decode steps that replay a graph: the engine's `decode_graph_hit_rate`."""
        return self.graph_steps / self.decode_steps if self.decode_steps else 0.0

    @property
    def padding_waste(self) -> float:
        """Padding tokens over real tokens: the engine's `padding_waste` on these steps."""
        return self.padding_tokens / self.real_tokens if self.real_tokens else 0.0


# ANCHOR_END: ladder_score


def _check_ladder(ladder: Iterable[int]) -> tuple[int, ...]:
    rungs = list(ladder)
    if any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in rungs):
        raise UserError(f"rungs are positive integers, got {rungs}")
    return tuple(sorted(set(rungs)))


# ANCHOR: evaluate_ladder
def evaluate_ladder(trace: Mapping[int, int] | Iterable[int], ladder: Iterable[int]) -> LadderScore:
    """Score a ladder on a trace (a list of batch sizes, or {size: steps})."""
    rungs = _check_ladder(ladder)
    report = padding_waste(_histogram(trace), list(rungs))  # Phase 05's rung lookup, reused
    return LadderScore(
        ladder=rungs,
        decode_steps=report.graph_steps + report.eager_steps,
        graph_steps=report.graph_steps,
        real_tokens=report.real_tokens,
        padding_tokens=report.padding_tokens,
    )


# ANCHOR_END: evaluate_ladder


# ANCHOR: score_with_engine
def score_with_engine(
    trace: Iterable[int],
    ladder: Iterable[int],
    cudagraph_mode: CUDAGraphMode | str = CUDAGraphMode.FULL_AND_PIECEWISE,
    max_num_seqs: int | None = None,
) -> EngineStats:
    """Replay a decode trace through the engine's own dispatcher and statistics.

    Each batch is routed by `CudagraphDispatcher.dispatch` exactly as the model runner
    routes a uniform-decode step, and recorded as the runner records it: the padded
    size is the descriptor's token count, the runtime mode the dispatcher's answer. So
    the returned `EngineStats.decode_graph_hit_rate` and `.padding_waste` are the
    numbers the engine would report for these steps (no model is run: seconds are 0).
    """
    sizes = [int(b) for b in trace]
    rungs = list(_check_ladder(ladder))
    if max_num_seqs is None:
        max_num_seqs = max(sizes + rungs, default=1)
    dispatcher = CudagraphDispatcher(cudagraph_mode, rungs, max_num_seqs)
    stats = EngineStats()
    for size in sizes:
        mode, descriptor = dispatcher.dispatch(size, uniform_decode=True)
        stats.record(
            StepRecord(
                num_reqs=size,
                num_tokens=size,
                num_padded_tokens=descriptor.num_tokens,
                num_prefill_tokens=0,
                num_decode_tokens=size,
                uniform_decode=True,
                runtime_mode=mode.name,
                seconds=0.0,
            )
        )
    return stats


# ANCHOR_END: score_with_engine


def powers_of_two_ladder(num_graphs: int) -> list[int]:
    """The naive ladder of `num_graphs` rungs: 1, 2, 4, ..., 2**(num_graphs - 1)."""
    if num_graphs < 1:
        raise UserError(f"a ladder has at least one rung, got {num_graphs}")
    return [2**i for i in range(num_graphs)]


# --- 3. Choosing a ladder ------------------------------------------------------------


# ANCHOR: choose_ladder
def choose_ladder(
    trace: Mapping[int, int] | Iterable[int],
    max_graphs: int,
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
    max_capture_size: int | None = None,
) -> list[int]:
    """The ladder of at most `max_graphs` rungs (each <= `max_capture_size`) whose hit
    rate on the trace is >= `min_hit_rate` and whose padding is the least possible.

    Two facts make it exact and cheap:
    - only sizes seen in the trace are worth a rung (lowering a rung to the largest
      size it actually serves keeps every hit and removes padding), and
    - the top rung is the smallest size that reaches the hit rate (a batch above the
      ladder runs eagerly and adds no padding, so a higher top only adds padding).
    Below the top, it is the classic 1-D partition problem, solved by dynamic
    programming over the m distinct sizes: O(max_graphs * m**2) time, O(max_graphs * m)
    memory (m <= the largest batch, a few hundred at most).
    Raises ValueError if no ladder within the bounds reaches the hit rate.
    """
    if max_graphs < 1:
        raise UserError(f"max_graphs must be >= 1 (a ladder needs a rung), got {max_graphs}")
    if not 0.0 <= min_hit_rate <= 1.0:
        raise UserError(f"min_hit_rate is a share of steps in [0, 1], got {min_hit_rate}")
    counts = _histogram(trace)
    if not counts:
        raise UserError("the trace holds no decode steps: record a run first")
    sizes = sorted(counts)
    total = sum(counts.values())
    # The top rung: the first size whose cumulative share of steps reaches the threshold.
    covered, top = 0, len(sizes) - 1
    for i, size in enumerate(sizes):
        covered += counts[size]
        if covered >= min_hit_rate * total - 1e-9:
            top = i
            break
    if max_capture_size is not None and sizes[top] > max_capture_size:
        reachable = sum(c for s, c in counts.items() if s <= max_capture_size) / total
        raise UserError(
            f"no ladder with rungs <= {max_capture_size} reaches a hit rate of {min_hit_rate:.0%}: "
            f"only {reachable:.1%} of decode steps are that small; {sizes[top]} is the "
            "smallest top rung that would do (raise max_capture_size, or lower min_hit_rate)"
        )
    sizes = sizes[: top + 1]
    m = len(sizes)
    # Prefix sums make the padding of "sizes[j+1..i] all padded up to sizes[i]" O(1).
    steps_before, tokens_before = [0], [0]
    for s in sizes:
        steps_before.append(steps_before[-1] + counts[s])
        tokens_before.append(tokens_before[-1] + counts[s] * s)

    def pad(j: int, i: int) -> int:  # sizes j..i (inclusive) padded up to sizes[i]
        steps = steps_before[i + 1] - steps_before[j]
        return steps * sizes[i] - (tokens_before[i + 1] - tokens_before[j])

    k_max = min(max_graphs, m)
    inf = math.inf
    # best[k][i]: least padding serving sizes[0..i] with k rungs, the highest at sizes[i].
    best = [[inf] * m for _ in range(k_max + 1)]
    prev = [[-1] * m for _ in range(k_max + 1)]
    for i in range(m):
        best[1][i] = pad(0, i)
    for k in range(2, k_max + 1):
        for i in range(k - 1, m):
            for j in range(k - 2, i):  # sizes[j] is the rung below sizes[i]
                cost = best[k - 1][j] + pad(j + 1, i)
                if cost < best[k][i]:
                    best[k][i], prev[k][i] = cost, j
    k = min(
        range(1, k_max + 1), key=lambda n: (best[n][m - 1], n)
    )  # least padding, then fewest graphs
    ladder, i = [], m - 1
    while k >= 1 and i >= 0:
        ladder.append(sizes[i])
        i, k = prev[k][i], k - 1
    return sorted(ladder)


# ANCHOR_END: choose_ladder


def tradeoff(
    trace: Mapping[int, int] | Iterable[int],
    graph_counts: Iterable[int],
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
) -> list[LadderScore]:
    """The chosen ladder's score for each graph budget: the curve to pick a budget from."""
    counts = _histogram(trace)
    return [evaluate_ladder(counts, choose_ladder(counts, n, min_hit_rate)) for n in graph_counts]


# --- 4. Recording a trace from a real run ----------------------------------------------


@dataclass(frozen=True)
class Request:
    arrival_step: int  # the engine step before which the request is added
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


# ANCHOR: make_workload
def make_workload(
    num_requests: int = 400,
    seed: int = 0,
    mean_arrivals_per_step: float = 0.45,
    period_steps: int = 400,
) -> list[Request]:
    """A chat-like day in miniature: arrivals rise and fall (a slow wave and short
    bursts), prompts of 8-64 tokens, answers of a few to ~150 tokens with a long tail.

    Arrivals are counted in engine steps, not seconds, so the batch sizes the engine
    sees do not depend on how fast the machine is: the trace is the same everywhere.
    """
    rng = random.Random(seed)
    requests, step = [], 0
    while len(requests) < num_requests:
        wave = 1.0 + 0.8 * math.sin(2 * math.pi * step / period_steps)
        burst = 4.0 if rng.random() < 0.01 else 1.0
        lam = mean_arrivals_per_step * wave * burst
        arrivals = sum(1 for _ in range(8) if rng.random() < lam / 8)  # binomial, mean lam
        for _ in range(arrivals):
            prompt = tuple(rng.randrange(1, 256) for _ in range(rng.randint(8, 64)))
            max_tokens = max(2, min(160, int(rng.lognormvariate(math.log(24), 0.8))))
            requests.append(Request(step, prompt, max_tokens))
        step += 1
    return requests[:num_requests]


# ANCHOR_END: make_workload


@dataclass
class RecordedRun:
    """Latencies of every request and the engine's statistics, from one run."""

    ttft_s: list[float] = field(default_factory=list)  # per request: added -> first token
    itl_s: list[float] = field(default_factory=list)  # every gap between two tokens of a request
    stats: EngineStats = field(default_factory=EngineStats)

    @property
    def decode_batch_sizes(self) -> list[int]:
        return trace_from_stats(self.stats)


# ANCHOR: run_workload
def run_workload(llm, workload: Sequence[Request]) -> RecordedRun:
    """Serve `workload` on an engine step by step, timing every token of every request.

    TTFT is measured from the moment a request is added (it includes the steps it
    waits in the queue) to the end of the step that sampled its first token; each
    inter-token latency is the time between two steps that gave the request a token.
    """
    engine = llm.engine
    engine.stats = EngineStats()  # this run only
    pending = sorted(workload, key=lambda r: r.arrival_step)
    added_at: dict[int, float] = {}
    last_token_at: dict[int, float] = {}
    seqs = []
    run = RecordedRun(stats=engine.stats)
    step, nxt = 0, 0
    while nxt < len(pending) or engine.has_unfinished_requests():
        while nxt < len(pending) and pending[nxt].arrival_step <= step:
            req = pending[nxt]
            params = SamplingParams(temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True)
            seq = engine.add_request(req.prompt_token_ids, params)
            added_at[seq.seq_id] = time.perf_counter()
            seqs.append(seq)
            nxt += 1
        if engine.has_unfinished_requests():
            before = {s.seq_id: len(s.output_token_ids) for s in seqs}
            engine.step()
            now = time.perf_counter()
            for s in seqs:
                if len(s.output_token_ids) > before[s.seq_id]:
                    if s.seq_id in last_token_at:
                        run.itl_s.append(now - last_token_at[s.seq_id])
                    else:
                        run.ttft_s.append(now - added_at[s.seq_id])
                    last_token_at[s.seq_id] = now
            seqs = [s for s in seqs if not s.is_finished]
        step += 1
    return run


# ANCHOR_END: run_workload


# The engine the lab's trace was recorded on (the tiny model, on CPU, with graphs).
RECORD_ENGINE = dict(
    device="cpu", dtype="float32", max_num_seqs=64, cudagraph_mode="FULL_AND_PIECEWISE"
)


def record_trace(
    num_requests: int = 400, seed: int = 0, model: str = "tiny", **engine_kwargs: object
) -> RecordedRun:
    """Run `make_workload(num_requests, seed)` on a fresh engine and return the run."""
    kwargs = {**RECORD_ENGINE, **engine_kwargs}
    loaded, tokenizer, _ = load_model(model, device=kwargs["device"], dtype=kwargs["dtype"], seed=0)
    llm = LLM.from_model(loaded, tokenizer, model=model, **kwargs)  # no capture progress bar
    return run_workload(llm, make_workload(num_requests, seed))


def save_trace(
    run: RecordedRun, path: str | Path, meta: Mapping[str, object] | None = None
) -> Path:
    """Write a run as JSON: decode batch sizes, per-step records, TTFT and ITL in ms."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        **(meta or {}),
        "decode_batch_sizes": run.decode_batch_sizes,
        "steps": [
            [s.num_tokens, s.num_prefill_tokens, int(s.uniform_decode), round(s.seconds * 1e3, 3)]
            for s in run.stats.steps
        ],
        "ttft_ms": [round(t * 1e3, 3) for t in run.ttft_s],
        "itl_ms": [round(t * 1e3, 3) for t in run.itl_s],
    }
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def load_trace(path: str | Path) -> dict[str, object]:
    """A saved run: `decode_batch_sizes`, `steps` ([tokens, prefill tokens, uniform, ms]),
    `ttft_ms`, `itl_ms`, and how it was made."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Record a decode batch-size trace from a tiny-model engine run."
    )
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run = record_trace(args.requests, args.seed)
    meta = {
        "command": f"python -m mini_vllm.bench.ladder --out {args.out} "
        f"--requests {args.requests} --seed {args.seed}",
        "model": "tiny",
        "engine": RECORD_ENGINE,
        "workload": {
            "function": "mini_vllm.bench.ladder.make_workload",
            "num_requests": args.requests,
            "seed": args.seed,
        },
    }
    save_trace(run, args.out, meta)
    trace = run.decode_batch_sizes
    print(
        f"{len(run.stats.steps)} steps, {len(trace)} decode steps, "
        f"batch sizes {min(trace)}..{max(trace)}; hit rate "
        f"{run.stats.decode_graph_hit_rate:.1%} on the default ladder -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
