"""Phase 06, lab 02 — the serving benchmark's metrics (your code).

`python -m mini_vllm bench serve` streams requests to the OpenAI-compatible server and
times, for each request, the chunks that carry tokens. This file turns those timings
into the report: TPOT, whether a request met its service-level objectives, latency
percentiles, and the run's throughput and goodput. vLLM's counterpart is
`calculate_metrics` in vllm/benchmarks/serve.py.
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
    """The request's time per output token after the first (TPOT), in seconds.

    Guarantees: the number `vllm bench serve` reports as this request's TPOT: the pace
    of the stream after its first token, as the client lived it. A request with no
    token after its first has none: 0.0. Reads `r`, changes nothing in it.

    Example: TTFT 0.25 s, five tokens in five chunks (gaps 0.25 s each), the stream's
    end with the last token (latency 1.25 s) -> 0.25.
    """
    raise NotImplementedError("TODO: step 1")


def meets_slo(r: RequestResult, slo_ms: dict[str, float]) -> bool:
    """Whether one request met every service-level objective (SLO) in `slo_ms`.

    Guarantees: `slo_ms` maps some of "ttft", "tpot", "itl", "e2el" to a bound in
    milliseconds. The request is good when, for every key given, what it measures of
    this request is within the bound, a value equal to the bound included: "ttft" its
    time to first token, "tpot" its `request_tpot`, "e2el" its latency, and "itl" the
    worst wait for a token a reader of the stream saw. An empty `slo_ms` asks for
    nothing. A request that failed was not served: it is never good. Reads `r`, changes
    nothing in it.

    Example: TTFT 0.5 s, gaps [0.03, 0.25, 0.03] s: {"ttft": 500} -> True;
    {"ttft": 500, "itl": 200} -> False.
    """
    raise NotImplementedError("TODO: step 1")


# -- step 2: percentiles ----------------------------------------------------------------------


def latency_percentiles(values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    """The mean and the percentiles of latencies, in milliseconds.

    Guarantees: `values_s` are seconds, in any order; the caller's list is left as it
    was. The result maps "mean" to their arithmetic mean and, for each `p` of
    `percentiles` (0 to 100), the key `"p" + format(p, "g")` ("p50" for 50.0, "p99.9"
    for 99.9) to the p-th percentile as `vllm bench serve` reports it, so that a report
    of yours reads like one of vLLM's. No values: every entry is 0.0.

    Example: [0.03, 0.01, 0.02], [50] -> {"mean": 20.0, "p50": 20.0} (up to float
    rounding).
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

    Guarantees: `results` holds every request of a run that took `duration` seconds
    (left as they were); a failed request counts as failed and in nothing else. The
    result has these keys:

    - "completed", "failed": successful and failed requests; "duration_s": `duration`;
    - "total_input_tokens", "total_output_tokens": the prompt and output tokens of the
      completed requests;
    - "request_throughput", "output_throughput", "total_token_throughput": completed
      requests, output tokens, and input plus output tokens, each per second of the run;
    - "num_good": how many requests meet every objective of `goodput_slo_ms`
      (`meets_slo`), "goodput": those per second of the run; both None when no
      objective is given (None or empty);
    - "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms": `latency_percentiles` summaries of the
      four latencies, each over the values `vllm bench serve` summarises for it.

    Example: two completed requests of 2 and 3 output tokens and prompts of 10 and 20
    tokens, over a 2 s run: "completed" 2, "request_throughput" 1.0,
    "output_throughput" 2.5, "total_token_throughput" 17.5.
    """
    raise NotImplementedError("TODO: step 3")
