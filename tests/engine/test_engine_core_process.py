"""The engine core in a process of its own (what `serve` runs): the same tokens as the offline
engine, the metrics fed across the process boundary, and the faults a process adds: a core
killed mid-stream, a server killed under its core, a core that fails to start, a factory
that cannot travel to the other process.

The server itself runs in a thread of the test process (`ServerThread`), its core in a
child process started with spawn, as `serve` starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.entrypoints.async_llm import AsyncLLM
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.entrypoints.openai.api_server import ServerThread, build_app
from mini_vllm.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
ENGINE = dict(cpu_threads=1, max_num_seqs=16)


def slow_tiny() -> LLM:
    """The tiny engine with 20 ms added to each step (a stream of 200 tokens: 4 s); a
    module-level function, so that it pickles into the core's process."""
    llm = LLM("tiny", **ENGINE)
    step = llm.engine.step

    def slow_step():
        time.sleep(0.02)
        return step()

    llm.engine.step = slow_step
    return llm


@contextlib.contextmanager
def serving(factory, wait=True):
    async_llm = AsyncLLM(factory, metrics=PrometheusStatLogger("tiny"), multiprocess=True)
    app = build_app(async_llm, "tiny")
    with ServerThread(app) as server:
        if wait:
            assert async_llm.wait_ready(120), async_llm.startup_error
        yield server, async_llm


def wait_until(condition, timeout=20.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child not yet reaped is a zombie: gone for our purposes.
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the sample `name{...}` with these labels (among others)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in /metrics")


def test_a_core_process_serves_what_the_offline_engine_generates():
    offline = LLM("tiny", **ENGINE)
    prompts = [[5 + i, 6, 7 + i % 3, 8] * (1 + i % 4) for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [out.token_ids for out in offline.generate(prompts, params, use_tqdm=False)]
    with serving(functools.partial(LLM, "tiny", **ENGINE)) as (srv, async_llm):
        assert async_llm.llm is None  # nothing of the engine lives in this process
        pid = async_llm._client.pid
        assert pid != os.getpid() and alive(pid)

        async def one(i):
            tokens = []
            async with contextlib.aclosing(
                async_llm.generate(f"r{i}", prompts[i], params)
            ) as deltas:
                async for delta in deltas:
                    assert delta.error is None, delta.error
                    tokens += delta.new_token_ids
            return tokens

        async def every():
            return await asyncio.gather(*(one(i) for i in range(len(prompts))))

        assert asyncio.run(every()) == expected
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "mini_vllm:generation_tokens_total") == 24 * len(prompts)
        assert metric(text, "mini_vllm:request_success_total", finished_reason="length") == 12
        assert metric(text, "mini_vllm:num_requests_running") == 0
        assert metric(text, "mini_vllm:time_to_first_token_seconds_count") == len(prompts)
    wait_until(lambda: not alive(pid), timeout=10, what="the core's exit after shutdown")


def test_a_killed_core_fails_its_requests_clearly_and_health_says_so():
    with serving(slow_tiny) as (srv, async_llm):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        stream = client.completions.create(
            model="tiny",
            prompt="a long one",
            max_tokens=200,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)  # the request is in the core, mid-stream
        os.kill(async_llm._client.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(openai.APIError, match="engine core process died"):
            for _ in chunks:
                pass
        assert time.monotonic() - start < 10
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "died" in health.json()["error"]
        with pytest.raises(openai.APIStatusError, match="restart the server") as refused:
            client.completions.create(model="tiny", prompt="again", max_tokens=2)
        assert refused.value.status_code == 503


def test_a_core_that_fails_to_start_says_why():
    factory = functools.partial(LLM, "tiny", max_model_len=5000, cpu_threads=1)
    with serving(factory, wait=False) as (srv, async_llm):
        wait_until(lambda: async_llm.startup_error is not None, timeout=120, what="the failure")
        assert isinstance(async_llm.startup_error, UserError)  # kept across the process
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "5000" in health.json()["error"]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIStatusError, match="failed to start"):
            client.completions.create(model="tiny", prompt="x", max_tokens=2)


def test_a_factory_that_cannot_pickle_is_refused_before_anything_starts():
    with pytest.raises(UserError, match="must pickle"):
        AsyncLLM(lambda: LLM("tiny"), multiprocess=True)


def test_the_core_exits_when_the_server_is_killed():
    command = [sys.executable, "-m", "mini_vllm", "serve", "--model", "tiny", "--port", "0"]
    server = subprocess.Popen(
        [*command, "--cpu-threads", "1"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "MINI_VLLM_ENABLE_MULTIPROCESSING": "1"},
    )
    try:
        url = re.search(r"at (http://\S+?)/v1 ", server.stdout.readline()).group(1)

        def ready():
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=120, what="the server's readiness")
        children = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent_of(p) == server.pid
        ]
        cores = [pid for pid in children if "spawn" in _command_line(pid)]
        assert len(cores) == 1, children
        server.kill()
        server.wait()
        wait_until(lambda: not alive(cores[0]), timeout=10, what="the orphaned core's exit")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _parent_of(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().split(")")[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_a_core_process_with_tensor_parallel_ranks_serves_and_ends_them():
    # The core starts a process of its own for rank 1, which a daemon process could not.
    factory = functools.partial(LLM, "tiny", tensor_parallel_size=2, **ENGINE)
    with serving(factory) as (srv, async_llm):
        core = async_llm._client.pid
        ranks = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent_of(p) == core and "spawn" in _command_line(int(p.name))
        ]
        assert len(ranks) == 1, ranks
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        answer = client.completions.create(model="tiny", prompt="hello", max_tokens=4)
        assert answer.choices[0].finish_reason in ("length", "stop")
    for pid in (core, *ranks):
        wait_until(lambda pid=pid: not alive(pid), timeout=20, what=f"process {pid}'s exit")
