"""`bench serve`: load an OpenAI-compatible server as clients would, and measure what they see.

vLLM counterpart: vllm/benchmarks/serve.py (`vllm bench serve`: a dataset of prompts sent at
a request rate, Poisson arrivals or all at once, or at most `--max-concurrency` at a time;
streaming clients; `calculate_metrics`: throughput, TTFT, TPOT, ITL and end-to-end latency
at percentiles, goodput under SLOs) with the random dataset of vllm/benchmarks/datasets.py
(`RandomDataset`: prompt and output lengths drawn around a mean, seeded).

Definitions (as vLLM's):
- TTFT: from sending the request to the first chunk that carries a token;
- ITL: the gaps between consecutive chunks that carry tokens, every gap of every request;
- TPOT: per request, (end-to-end latency - TTFT) / (output tokens - 1);
- E2EL: from sending to the last byte of the stream;
- goodput: requests per second that met every SLO given (`ttft:MS`, `tpot:MS`, `e2el:MS`,
  and `itl:MS`, met when the request's largest gap is within it).
The server's own view comes from its `/metrics`, read before and after each run: the
decode-graph hit rate (uniform-decode steps that replayed a graph), the padding waste and the
steps per runtime mode, counted over the run only.

Requests are greedy (`"temperature": 0.0`) unless told otherwise: the sampling options of
vLLM's benchmark (`--temperature`, `--top-p`, `--top-k`, `--min-p`, the penalties) and
`--extra-body`, a JSON object merged into every request body; an option not given is not sent.
`--api-key` (or $OPENAI_API_KEY) goes with every request as `Authorization: Bearer KEY`, and
to a server the benchmark starts; it is never written to the report.

The random prompts are token ids (the completions API takes them), drawn below 256 so that
every model's vocabulary has them; their lengths are exact. `--dataset-name questions` sends
a small shipped set of questions as text instead.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

import numpy as np

from mini_vllm.errors import UserError

__all__ = [
    "BENCHMARK_FIELDS",
    "GOODPUT_METRICS",
    "GREEDY",
    "QUESTIONS",
    "SAMPLING_FIELDS",
    "RequestResult",
    "SampleRequest",
    "ServeBenchReport",
    "ServeRunResult",
    "auth_headers",
    "calculate_metrics",
    "combine_markdown",
    "format_sampling",
    "format_serve_markdown",
    "latency_percentiles",
    "meets_slo",
    "parse_extra_body",
    "parse_goodput",
    "parse_request_rates",
    "plot_combined",
    "plot_report",
    "random_length_bounds",
    "request_body",
    "request_tpot",
    "run_serve_bench",
    "sample_requests",
    "sampling_options",
    "scrape_metrics",
    "started_server",
]

GOODPUT_METRICS = ("ttft", "tpot", "itl", "e2el")
PROMPT_TOKEN_RANGE = 256  # random prompt ids are drawn below this: in every model's vocabulary
# The request fields the benchmark sets itself: --extra-body may not change them.
BENCHMARK_FIELDS = (
    "model",
    "prompt",
    "max_tokens",
    "stream",
    "stream_options",
    "ignore_eos",
    "return_token_ids",
)
# The sampling options that are flags (--top-p for top_p), as vLLM's benchmark has them.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
GREEDY = {"temperature": 0.0}  # what a request asks for when no option is given


# -- the dataset --------------------------------------------------------------------------------

# `--dataset-name questions`, here and in `bench throughput` (mini_vllm/bench/throughput.py).
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


@dataclass(frozen=True)
class SampleRequest:
    prompt: list[int] | str  # token ids, or text (the questions dataset)
    prompt_len: int | None  # None for text: the server's usage tells
    output_len: int


def random_length_bounds(mean: int, range_ratio: float) -> tuple[int, int]:
    """The random dataset's lengths, both ends included: `floor(mean * (1 - ratio))` to
    `ceil(mean * (1 + ratio))`, as vLLM's `RandomDataset.get_sampling_params`. A low end of
    0 is raised to 1: vLLM does so for output lengths and refuses such an input range."""
    if not 0.0 <= range_ratio < 1.0:
        raise UserError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    return max(1, math.floor(mean * (1 - range_ratio))), math.ceil(mean * (1 + range_ratio))


def sample_requests(
    dataset: str,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
) -> list[SampleRequest]:
    """`num_prompts` requests; lengths uniform in [len * (1 - ratio), len * (1 + ratio)]."""
    if num_prompts < 1 or input_len < 1 or output_len < 1:
        raise UserError("--num-prompts, --random-input-len and --random-output-len must be >= 1")
    rng = np.random.default_rng(seed)

    def lengths(mean: int) -> np.ndarray:
        low, high = random_length_bounds(mean, range_ratio)
        return rng.integers(low, high + 1, size=num_prompts)

    inputs, outputs = lengths(input_len), lengths(output_len)
    if dataset == "random":
        return [
            SampleRequest(rng.integers(0, PROMPT_TOKEN_RANGE, size=n).tolist(), int(n), int(m))
            for n, m in zip(inputs, outputs)
        ]
    if dataset == "questions":
        return [
            SampleRequest(QUESTIONS[i % len(QUESTIONS)], None, int(m))
            for i, m in enumerate(outputs)
        ]
    raise UserError(f"--dataset-name {dataset!r}: use random or questions")


# -- the sampling options --------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_extra_body(text: str) -> dict:
    """`--extra-body`: a JSON object, merged into every request body; a field the benchmark
    sets itself (`BENCHMARK_FIELDS`) is refused."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"--extra-body is not valid JSON ({exc.msg} at column {exc.colno}): give a JSON "
            """object, quoted for the shell, e.g. --extra-body '{"stop": ["\\n\\n"]}'"""
        ) from None
    if not isinstance(body, dict):
        raise UserError(
            f"--extra-body must be a JSON object of request fields, got {type(body).__name__} "
            f"""{text.strip()!r}: e.g. --extra-body '{{"logprobs": 2}}'"""
        )
    taken = [name for name in BENCHMARK_FIELDS if name in body]
    if taken:
        raise UserError(
            f"--extra-body sets {', '.join(taken)}, which the benchmark sets itself (model: "
            "--served-model-name; prompt, max_tokens: the dataset options; stream, "
            "stream_options, return_token_ids: for the timing; ignore_eos: --ignore-eos): "
            "leave them out of it"
        )
    return body


def sampling_options(extra_body: dict | None = None, **options: float | int | None) -> dict:
    """The sampling fields the flags send: those given (None: not sent, so that a server
    which does not know a field still answers), and `temperature` 0.0 (greedy) unless a flag
    or the extra body gives one. A field both a flag and `extra_body` give is refused."""
    unknown = sorted(set(options) - set(SAMPLING_FIELDS))
    if unknown:
        raise TypeError(f"sampling_options() got unknown options {unknown}")
    extra = extra_body or {}
    twice = [name for name, value in options.items() if value is not None and name in extra]
    if twice:
        raise UserError(
            f"{', '.join(twice)} given twice, by {', '.join(_flag(n) for n in twice)} and in "
            "--extra-body: give each once"
        )
    fields = {name: options[name] for name in SAMPLING_FIELDS if options.get(name) is not None}
    if "temperature" not in fields and "temperature" not in extra:
        fields = {**GREEDY, **fields}
    return fields


def format_sampling(sampling: dict, extra_body: dict | None = None) -> str:
    """`greedy`, or e.g. `temperature 0.6, top_p 0.9, extra body {"stop": ["\\n\\n"]}`."""
    parts = []
    for name, value in sampling.items():
        if name == "temperature" and value == 0:
            parts.append("greedy")
        else:
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    if extra_body:
        parts.append(f"extra body `{json.dumps(extra_body)}`")
    return ", ".join(parts) or "the server's defaults"


# -- one request ------------------------------------------------------------------------------


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds, the gaps between token chunks
    latency: float = 0.0  # seconds, end to end
    start_time: float = 0.0


def request_body(
    model: str, request: SampleRequest, ignore_eos: bool, sampling: dict | None = None
) -> dict:
    """The body of one streaming completion: the benchmark's fields and `sampling` (the
    sampling options and the extra body, merged; default: greedy)."""
    sampling = GREEDY if sampling is None else sampling
    taken = [name for name in BENCHMARK_FIELDS if name in sampling]
    if taken:
        raise UserError(f"{', '.join(taken)}: set by the benchmark, not a sampling option")
    return {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.output_len,
        **sampling,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
        "return_token_ids": True,
    }


async def send_request(
    client,
    base_url: str,
    model: str,
    request: SampleRequest,
    ignore_eos: bool,
    sampling: dict | None = None,
) -> RequestResult:
    """One streaming completion; the times the client saw."""
    body = request_body(model, request, ignore_eos, sampling)
    result = RequestResult(prompt_len=request.prompt_len or 0)
    start = result.start_time = time.perf_counter()
    last = start
    tokens = 0
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:300]}"
                return result
            # ANCHOR: stream_timing
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                    result.prompt_len = chunk["usage"]["prompt_tokens"]
                for choice in chunk.get("choices", []):
                    new = len(choice.get("token_ids") or []) or (1 if choice.get("text") else 0)
                    if not new:
                        continue
                    now = time.perf_counter()
                    if tokens == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last, tokens = now, tokens + new
            # ANCHOR_END: stream_timing
    except Exception as exc:  # a refused or broken connection fails this request only
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.output_tokens = result.output_tokens or tokens
    result.success = tokens > 0
    if not result.success:
        result.error = "the stream ended without a token"
    return result


# -- a run at one request rate ---------------------------------------------------------------


async def _run_load(
    base_url: str,
    model: str,
    requests: list[SampleRequest],
    request_rate: float,
    max_concurrency: int | None,
    ignore_eos: bool,
    seed: int,
    timeout: float,
    log: Callable[[str], None],
    sampling: dict | None = None,
    api_key: str | None = None,
) -> tuple[list[RequestResult], float]:
    import httpx

    limit = max_concurrency or len(requests)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    semaphore = asyncio.Semaphore(limit)
    rng = np.random.default_rng(seed + 1)
    done = 0
    report_every = max(1, len(requests) // 10)

    async def one(client, request: SampleRequest) -> RequestResult:
        nonlocal done
        async with semaphore:
            result = await send_request(client, base_url, model, request, ignore_eos, sampling)
        done += 1
        if done % report_every == 0 or done == len(requests):
            log(f"  {done}/{len(requests)} requests done")
        return result

    # ANCHOR: arrivals
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout), limits=limits, headers=auth_headers(api_key)
    ) as client:
        start = time.perf_counter()
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(one(client, request)))
            if math.isfinite(request_rate):  # Poisson arrivals: exponential gaps
                await asyncio.sleep(rng.exponential(1.0 / request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    # ANCHOR_END: arrivals
    return list(results), duration


# ANCHOR: latency_percentiles
def latency_percentiles(values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    """Milliseconds: the mean and each percentile (0 for no values), keyed `mean`, `p50`,
    `p99.9`...; numpy's default percentile, linear between the two closest ranks."""
    ms = np.asarray(values_s, dtype=float) * 1e3
    out = {"mean": float(ms.mean()) if ms.size else 0.0}
    for p in percentiles:
        out[f"p{p:g}"] = float(np.percentile(ms, p)) if ms.size else 0.0
    return out


# ANCHOR_END: latency_percentiles


# ANCHOR: request_tpot
def request_tpot(r: RequestResult) -> float:
    """Time per output token after the first: (E2EL - TTFT) / (output tokens - 1), in seconds;
    0.0 for a request of one token (vLLM's definition, not the mean of its ITL gaps)."""
    return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0


# ANCHOR_END: request_tpot


# ANCHOR: meets_slo
def meets_slo(r: RequestResult, slo_ms: dict[str, float]) -> bool:
    """Whether a request met every SLO given (milliseconds, bounds included): `ttft`, `tpot`,
    `e2el`, and `itl` against the request's largest gap. A failed request meets none."""
    if not r.success:
        return False
    measured = {
        "ttft": r.ttft,
        "tpot": request_tpot(r),
        "itl": max(r.itl, default=0.0),
        "e2el": r.latency,
    }
    return all(measured[k] * 1e3 <= slo for k, slo in slo_ms.items())


# ANCHOR_END: meets_slo


# ANCHOR: calculate_metrics
def calculate_metrics(
    results: list[RequestResult],
    duration: float,
    percentiles: list[float],
    goodput_slo_ms: dict[str, float] | None = None,
) -> dict:
    """Throughput, latency percentiles and goodput over the successful requests."""
    ok = [r for r in results if r.success]
    ttfts = [r.ttft for r in ok]
    tpots_all = [request_tpot(r) for r in ok]
    itls = [gap for r in ok for gap in r.itl]
    e2els = [r.latency for r in ok]
    output_tokens = sum(r.output_tokens for r in ok)
    input_tokens = sum(r.prompt_len for r in ok)
    good = None
    if goodput_slo_ms:
        good = sum(meets_slo(r, goodput_slo_ms) for r in ok)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "goodput": None if good is None else good / duration,
        "num_good": good,
        "ttft_ms": latency_percentiles(ttfts, percentiles),
        "tpot_ms": latency_percentiles([t for t in tpots_all if t > 0], percentiles),
        "itl_ms": latency_percentiles(itls, percentiles),
        "e2el_ms": latency_percentiles(e2els, percentiles),
    }


# ANCHOR_END: calculate_metrics


# -- the server's view ------------------------------------------------------------------------


def scrape_metrics(text: str) -> dict[str, float]:
    """`/metrics` text as {sample name with its labels but model_name: value}, e.g.
    `mini_vllm:engine_steps_total{mode="FULL"}`; other servers' metrics are kept too."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            key = sample.name
            if labels:
                key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            values[key] = values.get(key, 0.0) + sample.value
    return values


# ANCHOR: server_delta
def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, object]:
    """What the server did during one run, from two scrapes of its /metrics."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if "mini_vllm:decode_steps_total" not in after:
        return {}  # not a mini_vllm server
    decode = delta("mini_vllm:decode_steps_total")
    replayed = delta("mini_vllm:decode_steps_replayed_total")
    real = delta("mini_vllm:batch_tokens_total")
    padded = delta("mini_vllm:batch_tokens_padded_total")
    steps = {
        mode: int(delta(f'mini_vllm:engine_steps_total{{mode="{mode}"}}'))
        for mode in ("NONE", "PIECEWISE", "FULL")
    }
    return {
        "decode_graph_hit_rate": replayed / decode if decode else 0.0,
        "padding_waste": (padded - real) / real if real else 0.0,
        "steps_per_mode": {mode: n for mode, n in steps.items() if n},
        "preemptions": int(delta("mini_vllm:num_preemptions_total")),
        "capture_seconds": after.get("mini_vllm:cudagraph_capture_seconds"),
        "graph_memory_bytes": after.get("mini_vllm:cudagraph_memory_bytes"),
        "num_graphs": after.get("mini_vllm:cudagraph_num_graphs"),
        "warmup_seconds": after.get("mini_vllm:warmup_seconds"),
    }


# ANCHOR_END: server_delta


# -- a server of our own ------------------------------------------------------------------------


class started_server:
    """`python -m mini_vllm serve ...` in a child process, on a free port, until /health
    answers 200; stopped with SIGINT (then killed if it lingers) on leaving the `with`.
    With `api_key`, its /v1 routes want that key (given as $MINI_VLLM_API_KEY, so that it
    shows neither in the command logged nor in the process list); without, no key."""

    def __init__(
        self,
        serve_args: list[str],
        timeout: float,
        log: Callable[[str], None],
        log_path: Path,
        api_key: str | None = None,
    ) -> None:
        self.args, self.timeout, self.log, self.log_path = serve_args, timeout, log, log_path
        self.api_key = api_key
        self.process: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> started_server:
        import httpx

        command = [sys.executable, "-m", "mini_vllm", "serve", *self.args]
        command += ["--port", "0", "--uvicorn-log-level", "warning"]
        self.log(f"starting the server: {shlex.join(command[1:])} (log: {self.log_path})")
        self._log_file = open(self.log_path, "w", encoding="utf-8")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("MINI_VLLM_API_KEY", None)  # the server wants the benchmark's key, or none
        if self.api_key:
            env["MINI_VLLM_API_KEY"] = self.api_key
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            env=env,
        )
        first_line = self.process.stdout.readline()
        self._log_file.write(first_line)
        found = re.search(r"at (http://\S+?)/v1 ", first_line)
        if not found:
            self._fail("the server did not say where it listens")
        self.base_url = found.group(1)
        start, last_said = time.monotonic(), 0.0
        while True:
            waited = time.monotonic() - start
            if self.process.poll() is not None:
                self._fail(f"the server exited with status {self.process.returncode}")
            if waited > self.timeout:
                self._fail(f"the server was not ready after {self.timeout:.0f} s")
            try:
                health = httpx.get(
                    f"{self.base_url}/health", timeout=5, headers=auth_headers(self.api_key)
                )
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if waited - last_said >= 15:
                self.log(f"  warming up ({waited:.0f} s): loading, compiling, capturing graphs")
                last_said = waited
            time.sleep(0.25)
        self.log(f"server ready at {self.base_url} after {time.monotonic() - start:.1f} s")
        return self

    def _fail(self, why: str) -> None:
        self.stop()
        tail = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise UserError(f"{why}; the end of its log ({self.log_path}):\n" + "\n".join(tail))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        if getattr(self, "_log_file", None) is not None:
            self._log_file.close()
            self._log_file = None

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# -- the whole benchmark --------------------------------------------------------------------------


@dataclass
class ServeRunResult:
    """One request rate."""

    request_rate: float
    metrics: dict
    server: dict
    itl_ms: list[float]  # every gap, for the plot
    errors: list[str]


@dataclass
class ServeBenchReport:
    label: str
    command: str
    machine: str
    base_url: str
    model: str
    engine_args: list[str] | None  # the flags of the server this run started; None: --base-url
    dataset: dict
    max_concurrency: int | None
    percentiles: list[float]
    goodput_slo_ms: dict[str, float]
    runs: list[ServeRunResult]
    date: str = field(default_factory=lambda: date.today().isoformat())
    # The sampling options sent (results from before they existed were greedy), and the
    # --extra-body merged into every request. The API key is never kept.
    sampling: dict = field(default_factory=lambda: dict(GREEDY))
    extra_body: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=float)

    @classmethod
    def from_json(cls, text: str) -> ServeBenchReport:
        data = json.loads(text)
        data["runs"] = [ServeRunResult(**run) for run in data["runs"]]
        return cls(**data)


def parse_request_rates(text: str) -> list[float]:
    rates = []
    for word in text.split(","):
        word = word.strip()
        try:
            rate = float(word)
        except ValueError:
            raise UserError(
                f"--request-rate {text!r}: give requests per second, or inf (all at once), "
                "or several separated by commas"
            ) from None
        if not rate > 0:
            raise UserError(f"--request-rate must be > 0 (or inf), got {word}")
        rates.append(rate)
    return rates


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "itl:50"]` -> {"ttft": 500.0, "itl": 50.0} (milliseconds)."""
    slo: dict[str, float] = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in GOODPUT_METRICS:
            raise UserError(
                f"--goodput {item!r}: the metric must be one of {', '.join(GOODPUT_METRICS)}, "
                "as in --goodput ttft:500 itl:50"
            )
        try:
            slo[name] = float(value)
        except ValueError:
            raise UserError(f"--goodput {item!r}: give milliseconds after the colon") from None
        if slo[name] <= 0:
            raise UserError(f"--goodput {item!r}: the SLO must be > 0 ms")
    return slo


def _machine() -> str:
    import torch

    if torch.cuda.is_available():
        where = torch.cuda.get_device_name()
    else:
        where = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    return f"{where}; torch {torch.__version__}; Python {platform.python_version()}"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer KEY`, sent with every request of the benchmark; none without."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _refused(base_url: str, api_key: str | None) -> UserError:
    """What to do after a 401."""
    if api_key:
        return UserError(
            f"{base_url} refused the API key (HTTP 401): pass the key the server was started "
            "with, --api-key KEY (or $OPENAI_API_KEY)"
        )
    return UserError(
        f"{base_url} wants an API key (HTTP 401): pass it with --api-key KEY (or set "
        "$OPENAI_API_KEY)"
    )


def _model_of(base_url: str, api_key: str | None = None) -> str:
    import httpx

    try:
        response = httpx.get(f"{base_url}/v1/models", timeout=30, headers=auth_headers(api_key))
        if response.status_code == 401:
            raise _refused(base_url, api_key)
        return response.json()["data"][0]["id"]
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"could not ask {base_url}/v1/models which model it serves ({exc}); check "
            "--base-url, or name the model with --served-model-name"
        ) from None


def _get_metrics(base_url: str, api_key: str | None = None) -> dict[str, float]:
    import httpx

    try:
        response = httpx.get(f"{base_url}/metrics", timeout=30, headers=auth_headers(api_key))
    except httpx.HTTPError:
        return {}
    return scrape_metrics(response.text) if response.status_code == 200 else {}


def run_serve_bench(
    base_url: str | None,
    model: str | None,
    requests: list[SampleRequest],
    request_rates: list[float],
    max_concurrency: int | None,
    ignore_eos: bool,
    goodput_slo_ms: dict[str, float],
    percentiles: list[float],
    dataset: dict,
    command: str,
    label: str,
    engine_args: list[str] | None = None,
    seed: int = 0,
    server_timeout: float = 600.0,
    request_timeout: float = 600.0,
    log: Callable[[str], None] = print,
    sampling: dict | None = None,
    extra_body: dict | None = None,
    api_key: str | None = None,
) -> ServeBenchReport:
    """Start a server with `engine_args` unless `base_url` is given; one run per rate.
    `sampling` (from `sampling_options`; default: greedy) and `extra_body` go into every
    request body; `api_key` with every request, and to the server started."""
    import contextlib

    sampling = dict(GREEDY) if sampling is None else dict(sampling)
    extra_body = dict(extra_body or {})
    fields = {**sampling, **extra_body}
    request_body(model or "", requests[0], ignore_eos, fields)  # a field it may not set fails now
    with contextlib.ExitStack() as stack:
        if base_url is None:
            log_path = Path(tempfile.gettempdir()) / f"mini_vllm-serve-{os.getpid()}.log"
            server = stack.enter_context(
                started_server(engine_args or [], server_timeout, log, log_path, api_key)
            )
            base_url = server.base_url
        base_url = base_url.rstrip("/").removesuffix("/v1")
        model = model or _model_of(base_url, api_key)
        # One short request first: the path works, and no run pays a first-call cost.
        warm = asyncio.run(
            _run_load(
                base_url,
                model,
                requests[:1],
                math.inf,
                1,
                True,
                seed,
                request_timeout,
                _quiet,
                fields,
                api_key,
            )
        )[0][0]
        if warm.error.startswith("HTTP 401"):
            raise _refused(base_url, api_key)
        if not warm.success:
            raise UserError(f"the first request to {base_url} failed: {warm.error}")
        runs = []
        for rate in request_rates:
            shown = "inf (all at once)" if math.isinf(rate) else f"{rate:g} requests/s"
            log(f"run: {len(requests)} requests at {shown}, concurrency {max_concurrency or 'any'}")
            before = _get_metrics(base_url, api_key)
            results, duration = asyncio.run(
                _run_load(
                    base_url,
                    model,
                    requests,
                    rate,
                    max_concurrency,
                    ignore_eos,
                    seed,
                    request_timeout,
                    log,
                    fields,
                    api_key,
                )
            )
            metrics = calculate_metrics(results, duration, percentiles, goodput_slo_ms)
            run = ServeRunResult(
                request_rate=rate,
                metrics=metrics,
                server=server_delta(before, _get_metrics(base_url, api_key)),
                itl_ms=[round(g * 1e3, 4) for r in results if r.success for g in r.itl],
                errors=sorted({r.error for r in results if not r.success})[:5],
            )
            runs.append(run)
            log(_summary_line(run))
    return ServeBenchReport(
        label=label,
        command=command,
        machine=_machine(),
        base_url=base_url,
        model=model,
        engine_args=engine_args,
        dataset=dataset,
        max_concurrency=max_concurrency,
        percentiles=percentiles,
        goodput_slo_ms=goodput_slo_ms,
        runs=runs,
        sampling=sampling,
        extra_body=extra_body,
    )


def _quiet(_: str) -> None:
    pass


def _rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _summary_line(run: ServeRunResult) -> str:
    m = run.metrics
    hit = run.server.get("decode_graph_hit_rate")
    return (
        f"  {m['completed']} done, {m['failed']} failed in {m['duration_s']:.1f} s: "
        f"{m['request_throughput']:.2f} req/s, {m['output_throughput']:.1f} output tok/s; "
        f"TTFT P50 {m['ttft_ms']['p50']:.1f} ms; ITL P50 {m['itl_ms']['p50']:.2f} ms, "
        f"P99 {m['itl_ms']['p99']:.2f} ms"
        + (f"; decode graph hit rate {hit:.1%}" if hit is not None else "")
    )


# -- the report -----------------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


def format_serve_markdown(report: ServeBenchReport, plot_path: str | None = None) -> str:
    ds = report.dataset
    lines = [
        f"# Serving benchmark: {report.model} ({report.label})",
        "",
        f"- date: {report.date}",
        f"- machine: {report.machine}",
        f"- command: `{report.command}`",
        "- server: "
        + (
            f"started by the benchmark, `python -m mini_vllm serve "
            f"{shlex.join(report.engine_args)}`"
            if report.engine_args is not None
            else f"{report.base_url} (started separately)"
        ),
        f"- dataset: {ds['name']}, {ds['num_prompts']} prompts, input {ds['input_len']} and "
        f"output {ds['output_len']} tokens (range ratio {ds['range_ratio']}), seed {ds['seed']}"
        f"{', EOS ignored' if ds.get('ignore_eos') else ''}",
        f"- arrivals: Poisson at each request rate (inf: all at once); concurrency limit "
        f"{report.max_concurrency or 'none'}; streaming completions",
        f"- sampling: {format_sampling(report.sampling, report.extra_body)}",
    ]
    if report.goodput_slo_ms:
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in report.goodput_slo_ms.items())
        lines.append(f"- goodput SLO: {slo} (itl: the request's largest gap)")
    lines += [
        "",
        "| request rate (req/s) | done | failed | duration s | req/s | output tok/s "
        "| goodput req/s | decode graph hit rate | padding waste | steps (mode: count) "
        "| preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report.runs:
        m, s = run.metrics, run.server
        steps = ", ".join(f"{k}: {v}" for k, v in s.get("steps_per_mode", {}).items()) or "n/a"
        goodput = "n/a" if m["goodput"] is None else f"{m['goodput']:.2f}"
        lines.append(
            f"| {_rate(run.request_rate)} | {m['completed']} | {m['failed']} | "
            f"{m['duration_s']:.2f} | {m['request_throughput']:.2f} | "
            f"{m['output_throughput']:.1f} | {goodput} | "
            f"{_share(s.get('decode_graph_hit_rate'))} | {_share(s.get('padding_waste'))} | "
            f"{steps} | {s.get('preemptions', 'n/a')} |"
        )
    pcts = [f"p{p:g}" for p in report.percentiles]
    lines += [
        "",
        "Latencies in milliseconds (mean, then percentiles):",
        "",
        "| request rate | metric | mean | " + " | ".join(p.upper() for p in pcts) + " |",
        "|---|---|---|" + "---|" * len(pcts),
    ]
    for run in report.runs:
        for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
            values = run.metrics[key]
            lines.append(
                f"| {_rate(run.request_rate)} | {name} | {values['mean']:.2f} | "
                + " | ".join(f"{values[p]:.2f}" for p in pcts)
                + " |"
            )
        values = run.metrics["e2el_ms"]
        lines.append(
            f"| {_rate(run.request_rate)} | E2EL | {values['mean']:.1f} | "
            + " | ".join(f"{values[p]:.1f}" for p in pcts)
            + " |"
        )
    server = report.runs[0].server if report.runs else {}
    if server:
        lines += [
            "",
            f"Server warm-up: {server.get('warmup_seconds') or 0:.1f} s (load, compile, capture); "
            f"{int(server.get('num_graphs') or 0)} graphs captured in "
            f"{server.get('capture_seconds') or 0:.2f} s, graph memory "
            f"{_mib(server.get('graph_memory_bytes'))} (0 on CPU).",
        ]
    errors = sorted({e for run in report.runs for e in run.errors})
    if errors:
        lines += ["", "Errors (first few):", ""] + [f"- {e}" for e in errors[:5]]
    if plot_path:
        lines += ["", f"Plot (ITL distribution, latency percentiles): `{plot_path}`"]
    return "\n".join(lines) + "\n"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def plot_report(report: ServeBenchReport, path: Path) -> bool:
    """The ITL distribution and the latency percentiles, per request rate; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5))
    for run in report.runs:
        if run.itl_ms:
            left.hist(
                run.itl_ms, bins=50, histtype="step", label=f"rate {_rate(run.request_rate)} req/s"
            )
    left.set_title(f"Inter-token latency distribution ({report.label})")
    left.set_xlabel("inter-token latency (ms)")
    left.set_ylabel("token gaps (count)")
    left.legend()
    pcts = [f"p{p:g}" for p in report.percentiles]
    metrics = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")]
    width = 0.8 / max(1, len(report.runs) * len(pcts))
    for i, run in enumerate(report.runs):
        for j, p in enumerate(pcts):
            offset = (i * len(pcts) + j) * width
            right.bar(
                [k + offset for k in range(len(metrics))],
                [run.metrics[key][p] for key, _ in metrics],
                width,
                label=f"rate {_rate(run.request_rate)}, {p.upper()}",
            )
    right.set_xticks([k + 0.4 - width / 2 for k in range(len(metrics))])
    right.set_xticklabels([name for _, name in metrics])
    right.set_yscale("log")
    right.set_title("Latency percentiles")
    right.set_ylabel("latency (ms, log scale)")
    right.set_xlabel("metric")
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"bench serve: {report.model} on {report.machine.split(';')[0]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- several configurations side by side (scripts/gpu/serve_bench.sh) ------------------------


def combine_markdown(reports: list[ServeBenchReport], command: str, title: str) -> str:
    """One table: every configuration at every rate, P50/P99 ITL and throughput side by side."""
    first = reports[0]
    ds = first.dataset
    lines = [
        f"# {title}",
        "",
        f"- date: {first.date}",
        f"- machine: {first.machine}",
        f"- command: `{command}`",
        f"- model: {first.model}; dataset: {ds['name']}, {ds['num_prompts']} prompts, input "
        f"{ds['input_len']} and output {ds['output_len']} tokens (range ratio "
        f"{ds['range_ratio']}), seed {ds['seed']}{', EOS ignored' if ds.get('ignore_eos') else ''}",
        "- each configuration: its own server (`python -m mini_vllm serve`), started by "
        "`python -m mini_vllm bench serve`, then one run per request rate (Poisson arrivals; "
        "inf: all at once); streaming completions",
        f"- sampling: {_combined_sampling(reports)}",
        "",
        "| configuration | rate (req/s) | output tok/s | req/s | ITL P50 ms | ITL P99 ms "
        "| TTFT P50 ms | TTFT P99 ms | TPOT P50 ms | decode graph hit rate | padding waste "
        "| failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        for run in report.runs:
            m, s = run.metrics, run.server
            lines.append(
                f"| {report.label} | {_rate(run.request_rate)} | {m['output_throughput']:.1f} | "
                f"{m['request_throughput']:.2f} | {m['itl_ms']['p50']:.2f} | "
                f"{m['itl_ms'].get('p99', float('nan')):.2f} | {m['ttft_ms']['p50']:.1f} | "
                f"{m['ttft_ms'].get('p99', float('nan')):.1f} | {m['tpot_ms']['p50']:.2f} | "
                f"{_share(s.get('decode_graph_hit_rate'))} | {_share(s.get('padding_waste'))} | "
                f"{m['failed']} |"
            )
    lines += ["", "Warm-up and capture of each configuration's default ladder:", ""]
    lines += [
        "| configuration | server flags | warm-up s | graphs | capture s | graph memory |",
        "|---|---|---|---|---|---|",
    ]
    for report in reports:
        s = report.runs[0].server if report.runs else {}
        flags = shlex.join(report.engine_args) if report.engine_args is not None else "n/a"
        lines.append(
            f"| {report.label} | `{flags}` | {s.get('warmup_seconds') or 0:.1f} | "
            f"{int(s.get('num_graphs') or 0)} | {s.get('capture_seconds') or 0:.2f} | "
            f"{_mib(s.get('graph_memory_bytes'))} |"
        )
    return "\n".join(lines) + "\n"


def _combined_sampling(reports: list[ServeBenchReport]) -> str:
    shown = [format_sampling(r.sampling, r.extra_body) for r in reports]
    if len(set(shown)) == 1:
        return shown[0]
    return "; ".join(f"{r.label}: {text}" for r, text in zip(reports, shown))


def plot_combined(reports: list[ServeBenchReport], path: Path) -> bool:
    """P50 and P99 ITL per configuration and rate; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rates = sorted({run.request_rate for r in reports for run in r.runs})
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / max(1, len(reports))
    for i, report in enumerate(reports):
        by_rate = {run.request_rate: run for run in report.runs}
        for p, hatch in (("p99", "//"), ("p50", "")):
            ax.bar(
                [k + i * width for k in range(len(rates))],
                [by_rate[r].metrics["itl_ms"].get(p, 0) if r in by_rate else 0 for r in rates],
                width,
                hatch=hatch,
                alpha=0.5 if p == "p99" else 1.0,
                color=f"C{i}",
                label=f"{report.label} {p.upper()}",
            )
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rates))])
    ax.set_xticklabels([f"{r:g} req/s" if math.isfinite(r) else "inf (all at once)" for r in rates])
    ax.set_yscale("log")
    ax.set_xlabel("request rate")
    ax.set_ylabel("inter-token latency (ms, log scale)")
    ax.set_title(f"ITL P50 (solid) and P99 (hatched): {reports[0].model}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m mini_vllm.bench.serve combine A.json B.json --output X.md`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mini_vllm.bench.serve",
        description="Put the JSON results of several `bench serve --save-json` runs side by side.",
    )
    parser.add_argument("action", choices=["combine"])
    parser.add_argument("results", nargs="+", type=Path, help="JSON files of bench serve")
    parser.add_argument("--output", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--title", default="Serving benchmark: configurations side by side")
    parser.add_argument("--command", default="", help="the command to record in the file")
    args = parser.parse_args(argv)
    reports = [ServeBenchReport.from_json(p.read_text(encoding="utf-8")) for p in args.results]
    command = args.command or shlex.join(["python", "-m", "mini_vllm.bench.serve", *sys.argv[1:]])
    text = combine_markdown(reports, command, args.title)
    plot = args.output.with_suffix(".png")
    if plot_combined(reports, plot):
        text += f"\nPlot (ITL P50 and P99 per configuration and rate): `{plot}`\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
