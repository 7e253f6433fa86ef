"""The server's Prometheus metrics: what `GET /metrics` shows, named `mini_vllm:*`.

vLLM counterpart: vllm/v1/metrics/loggers.py (`PrometheusStatLogger`: `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:num_preemptions`, `vllm:prompt_tokens`,
`vllm:generation_tokens`, `vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`, `vllm:e2e_request_latency_seconds`, ...). The names here
are vLLM's with `mini_vllm:` for `vllm:`; the CUDA-graph metrics are the course's
(Phase 06): the decode-graph hit rate, padding waste, steps per runtime mode, capture time
and graph memory.

Every server has its own `CollectorRegistry`, so several can run in one process (the tests
do). Everything is fed as the engine core's outputs reach the server (the core may run in
another process): after each step the core's counters and gauges (`record_step`, from the
turn's `SchedulerStats`), and per request the tokens and latencies as they arrive
(`on_tokens`, `on_finished`). A counter shows in the text as `<name>_total` (Prometheus'
rule).

The latency histograms have finer buckets than vLLM's at the low end: a decode step replayed
from a CUDA graph takes about a millisecond here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from mini_vllm.engine.core import EngineInfo, SchedulerStats

__all__ = ["PREFIX", "PrometheusStatLogger"]

PREFIX = "mini_vllm:"

# ANCHOR: buckets
_TTFT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75]
_TTFT_BUCKETS += [1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0]
_ITL_BUCKETS = [0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025]
_ITL_BUCKETS += [0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
_E2E_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0]
_E2E_BUCKETS += [20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0]
# ANCHOR_END: buckets
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
FINISH_REASONS = ("stop", "length", "abort", "error")


class PrometheusStatLogger:
    """The metrics of one server, in its own registry, labelled with the served model's name."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(
                PREFIX + name, doc, labels, buckets=buckets, registry=self.registry
            ).labels(model_name)

        # Scheduler state, read when scraped.
        self.num_requests_running = gauge(
            "num_requests_running", "Requests in the engine's running queue (holding KV blocks)."
        )
        self.num_requests_waiting = gauge(
            "num_requests_waiting", "Requests waiting to be admitted (new, or preempted)."
        )
        self.kv_cache_usage = gauge(
            "kv_cache_usage_perc", "KV-cache usage: used blocks over all blocks, 1 = full."
        )
        # Counters, fed after each step.
        self.num_preemptions = counter(
            "num_preemptions", "Requests preempted (their blocks freed, recomputed later)."
        )
        self.prompt_tokens = counter(
            "prompt_tokens", "Prompt tokens of the requests that got their first token."
        )
        self.generation_tokens = counter("generation_tokens", "Tokens generated and delivered.")
        self.engine_step_failures = counter(
            "engine_step_failures", "Engine steps that raised (their requests got an error)."
        )
        # The sums behind the graph gauges, so that a client can take differences over a run.
        self.decode_steps = counter("decode_steps", "Uniform-decode steps (every row decodes).")
        self.decode_steps_replayed = counter(
            "decode_steps_replayed", "Uniform-decode steps that replayed a CUDA graph."
        )
        self.batch_tokens = counter("batch_tokens", "Tokens computed, over every step.")
        self.batch_tokens_padded = counter(
            "batch_tokens_padded", "Tokens after padding to a captured size (= real when eager)."
        )
        steps = Counter(
            PREFIX + "engine_steps",
            "Engine steps (forwards), by the CUDA-graph runtime mode that ran them.",
            ["model_name", "mode"],
            registry=self.registry,
        )
        self.engine_steps = {mode: steps.labels(model_name, mode) for mode in RUNTIME_MODES}
        success = Counter(
            PREFIX + "request_success",
            "Requests ended, by finish reason (stop, length, abort, error).",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.request_success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        # Latencies, measured as each turn's tokens reach the server.
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Time from the request's arrival to its first token, in seconds.",
            _TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds",
            "Time between two consecutive tokens of a request, in seconds.",
            _ITL_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds",
            "Time from the request's arrival to its last token, in seconds.",
            _E2E_BUCKETS,
        )
        # CUDA graphs (Phase 05/06).
        self.decode_graph_hit_rate = gauge(
            "decode_graph_hit_rate", "Share of uniform-decode steps that replayed a CUDA graph."
        )
        self.padding_waste = gauge(
            "padding_waste", "Padded tokens over real tokens, over every step so far."
        )
        self.cudagraph_capture_seconds = gauge(
            "cudagraph_capture_seconds", "Time the warm-up took to capture every graph."
        )
        self.cudagraph_memory_bytes = gauge(
            "cudagraph_memory_bytes", "Device memory the captured graphs hold (0 on CPU)."
        )
        self.cudagraph_num_graphs = gauge(
            "cudagraph_num_graphs", "Graphs captured (each piece of a piecewise graph counted)."
        )
        self.warmup_seconds = gauge(
            "warmup_seconds",
            "Start-up: load the weights, compile, capture; /health is 503 until then.",
        )
        self._seen: dict[str, int] = {}
        self._seen_steps = dict.fromkeys(RUNTIME_MODES, 0)
        # counter: the EngineStats field it follows
        self._follows = {
            self.num_preemptions: "num_preemptions",
            self.engine_step_failures: "num_steps_taken_back",
            self.decode_steps: "num_decode_steps",
            self.decode_steps_replayed: "num_decode_steps_replayed",
            self.batch_tokens: "num_real_tokens",
            self.batch_tokens_padded: "num_padded_tokens",
        }

    # -- called once the engine is up ----------------------------------------------------

    # ANCHOR: on_engine_ready
    def on_engine_ready(self, info: EngineInfo) -> None:
        if info.capture_num_graphs is not None:
            self.cudagraph_capture_seconds.set(info.capture_seconds)
            self.cudagraph_memory_bytes.set(info.capture_memory_bytes or 0)
            self.cudagraph_num_graphs.set(info.capture_num_graphs)
        self.warmup_seconds.set(info.warmup_seconds)

    # ANCHOR_END: on_engine_ready

    # -- called as the engine core's outputs come in -------------------------------------

    # ANCHOR: record_step
    def record_step(self, stats: SchedulerStats) -> None:
        """After a step: the gauges, and the engine's counters as increments since the last
        call."""
        self.num_requests_running.set(stats.num_running_reqs)
        self.num_requests_waiting.set(stats.num_waiting_reqs)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        counts = stats.engine
        self.decode_graph_hit_rate.set(counts.decode_graph_hit_rate)
        self.padding_waste.set(counts.padding_waste)
        for metric, name in self._follows.items():
            value = getattr(counts, name)
            metric.inc(value - self._seen.get(name, 0))
            self._seen[name] = value
        for mode in RUNTIME_MODES:
            count = counts.steps_per_runtime_mode.get(mode, 0)
            self.engine_steps[mode].inc(count - self._seen_steps[mode])
            self._seen_steps[mode] = count

    # ANCHOR_END: record_step

    # ANCHOR: on_tokens
    def on_tokens(self, num_prompt_tokens: int, num_new: int, first: bool, gap: float) -> None:
        """A request got `num_new` tokens, `gap` seconds after its arrival (the first ones)
        or after its previous tokens; the gap is shared evenly between the new tokens."""
        if num_new == 0:
            return
        self.generation_tokens.inc(num_new)
        if first:
            self.prompt_tokens.inc(num_prompt_tokens)
            self.time_to_first_token.observe(gap)
            num_new -= 1  # the others came in the same step: no wait of their own
            gap = 0.0
        for _ in range(num_new):
            self.inter_token_latency.observe(gap / num_new if num_new else 0.0)

    def on_finished(self, finish_reason: str, seconds_since_arrival: float | None) -> None:
        self.request_success[finish_reason].inc()
        if seconds_since_arrival is not None and finish_reason in ("stop", "length"):
            self.e2e_request_latency.observe(seconds_since_arrival)

    # ANCHOR_END: on_tokens
