"""Phase 06, lab 02 — the serving benchmark's metrics (your code).

`python -m mini_vllm bench serve` streams requests to the OpenAI-compatible server and
times, for each request, the chunks that carry tokens. This file turns those timings
into the report: TPOT, whether a request met its service-level objectives, latency
percentiles, and the run's throughput and goodput. The reference is
`mini_vllm/bench/serve.py`; vLLM's counterpart is `calculate_metrics` in
vllm/benchmarks/serve.py.
Run: pytest labs/phase-06/lab-02-serving-metrics
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np  # noqa: F401  (you may use it)


@dataclass
class RequestResult:
    """Given: what the client saw of one streamed request (filled in by `send_request`).

    `ttft` runs from sending the request to the first chunk that carries a token; `itl`
    holds one gap per later chunk that carries tokens (a chunk may carry several, so
    `len(itl)` can be less than `output_tokens - 1`); `latency` runs from sending to the
    end of the stream, which comes a little after the last token. A failed request
    (`success` False) has `error` set and timings that mean nothing.
    """

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds, the gaps between token chunks
    latency: float = 0.0  # seconds, end to end
    start_time: float = 0.0


# -- step 1: one request --------------------------------------------------------------------


def request_tpot(r: RequestResult) -> float:
    """The request's time per output token after the first, in seconds.

    Guarantees: `(latency - ttft) / (output_tokens - 1)`, the definition vLLM's benchmark
    uses: the whole time after the first token, the end of the stream included, over the
    tokens that came after the first (counted as tokens, not as chunks). A request with
    fewer than two tokens has no such time: 0.0.

    Example: TTFT 0.25 s, latency 1.25 s, 5 tokens -> 0.25.
    """
    raise NotImplementedError("TODO: step 1")


def meets_slo(r: RequestResult, slo_ms: dict[str, float]) -> bool:
    """Whether one request met every service-level objective in `slo_ms`.

    Guarantees: `slo_ms` maps some of "ttft", "tpot", "itl", "e2el" to a bound in
    milliseconds (the request's timings are in seconds). The request is good when each
    metric named is at or under its bound (a request exactly at the bound meets it):
    "ttft" is its TTFT, "tpot" its `request_tpot`, "e2el" its latency, and "itl" its
    largest gap (0 for a request without gaps). Every bound named must hold; an empty
    `slo_ms` asks for nothing. A failed request meets no objective.

    Example: TTFT 0.5 s, gaps [0.03, 0.25, 0.03] s:
    {"ttft": 500} -> True; {"ttft": 500, "itl": 200} -> False.
    """
    raise NotImplementedError("TODO: step 1")


# -- step 2: percentiles ----------------------------------------------------------------------


def latency_percentiles(values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    """The mean and the percentiles of latencies, in milliseconds.

    Guarantees: `values_s` are seconds, in any order. The result maps "mean" to their
    arithmetic mean and, for each `p` of `percentiles` (0 to 100), the key
    `"p" + format(p, "g")` ("p50" for 50.0, "p99.9" for 99.9) to the p-th percentile,
    all in milliseconds. The p-th percentile of n values is the value at rank
    p / 100 * (n - 1) of the sorted values (ranks counted from 0), interpolated linearly
    between the two ranks around it when that rank is not a whole number: numpy's
    default (`numpy.percentile`, method "linear"), which `vllm bench serve` reports.
    No values: every entry is 0.0.

    Example: [0.04, 0.01, 0.03, 0.02], [50, 99] -> {"mean": 25.0, "p50": 25.0,
    "p99": 39.7} (up to float rounding).
    """
    raise NotImplementedError("TODO: step 2")


# -- step 3: the run --------------------------------------------------------------------------


def calculate_metrics(
    results: list[RequestResult],
    duration: float,
    percentiles: list[float],
    goodput_slo_ms: dict[str, float] | None = None,
) -> dict:
    """A run's report: what `bench serve` prints and saves for one request rate.

    Guarantees: `results` holds every request of a run that took `duration` seconds;
    only the successful ones enter the token counts, the throughputs and the latencies.
    The result has these keys:

    - "completed", "failed": successful and failed requests; "duration_s": `duration`;
    - "total_input_tokens", "total_output_tokens": sums of `prompt_len` and of
      `output_tokens`;
    - "request_throughput", "output_throughput", "total_token_throughput": completed
      requests, output tokens, and input plus output tokens, each per second of the run;
    - "num_good": how many requests meet every objective of `goodput_slo_ms`
      (`meets_slo`), "goodput": those per second of the run; both None when no
      objective is given (None or empty);
    - "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms": `latency_percentiles` of the TTFTs, of
      the TPOTs of the requests that have one (two tokens or more), of every gap of
      every request pooled together, and of the latencies.

    Example: two successful requests of 2 and 3 tokens over a 2 s run give
    "output_throughput" 2.5, and "itl_ms" summarises their three gaps together.
    """
    raise NotImplementedError("TODO: step 3")
