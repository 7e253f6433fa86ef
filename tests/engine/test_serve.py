"""The OpenAI-compatible server (`python -m mini_vllm serve`), driven by the official `openai`
client on 127.0.0.1: completions and chat, streamed and whole; OpenAI errors with the right
status; 64 concurrent streams equal to the offline `LLM`; a client that disconnects; `/health`
during and after the warm-up; `/metrics` against the engine's statistics; an engine step that
fails; `bench serve` end to end; the command itself, stopped by SIGTERM.

Every server here runs the `tiny` model in a thread of the test process (`ServerThread`, on a
free port), except the last test's, a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
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
# A template for a model without one (tiny): "role: content" lines, then "assistant:".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPTS = [f"prompt {i}: " + "abcdefgh"[: 1 + i % 8] * (1 + i % 5) for i in range(64)]


@contextlib.contextmanager
def serving(factory, name="tiny", chat_template=None, wait=True):
    """(server, async_llm) of a server in a thread; waits for the warm-up unless told not to."""
    async_llm = AsyncLLM(factory, metrics=PrometheusStatLogger(name))
    app = build_app(async_llm, name, chat_template=chat_template)
    with ServerThread(app) as server:
        if wait:
            assert async_llm.wait_ready(120), async_llm.startup_error
        yield server, async_llm


def wait_until(condition, timeout=20.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)


def engine_idle_and_free(async_llm) -> bool:
    engine = async_llm.llm.engine
    blocks = engine.block_manager
    return not engine.has_unfinished_requests() and blocks.num_free_blocks == blocks.num_blocks


def client_for(server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, **kwargs)


def slow_engine():
    """The server's engine with 20 ms added to every step (a stream of 200 tokens: 4 s)."""
    llm = LLM("tiny", **ENGINE)
    step = llm.engine.step

    def slow_step():
        time.sleep(0.02)
        return step()

    llm.engine.step = slow_step
    return llm


@pytest.fixture(scope="module")
def offline():
    """The offline engine, with the server's options: the reference outputs."""
    return LLM("tiny", **ENGINE)


def offline_tokens(offline, prompt, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    out = offline.generate([prompt], params, use_tqdm=False)[0]
    return out.token_ids, out.text, out.finish_reason


@pytest.fixture(scope="module")
def server():
    with serving(lambda: LLM("tiny", **ENGINE), chat_template=CHAT_TEMPLATE) as pair:
        yield pair


# -- the API through the openai client ----------------------------------------------------------


def test_completion_equals_the_offline_llm(server, offline):
    srv, _ = server
    client = client_for(srv)
    result = client.completions.create(
        model="tiny",
        prompt=PROMPTS[3],
        max_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    ids, text, reason = offline_tokens(offline, PROMPTS[3], 12)
    choice = result.choices[0]
    assert (choice.token_ids, choice.text, choice.finish_reason) == (ids, text, reason)
    assert result.object == "text_completion" and result.model == "tiny"
    prompt_len = len(PROMPTS[3].encode())
    assert result.usage.prompt_tokens == prompt_len
    assert result.usage.completion_tokens == len(ids)
    assert result.usage.total_tokens == prompt_len + len(ids)


def test_streamed_completion_adds_up_to_the_whole_one(server, offline):
    srv, _ = server
    stream = client_for(srv).completions.create(
        model="tiny",
        prompt=PROMPTS[5],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    ids, text, reason = offline_tokens(offline, PROMPTS[5], 10)
    token_chunks = [c for c in chunks if c.choices]
    assert [t for c in token_chunks for t in c.choices[0].token_ids] == ids
    assert "".join(c.choices[0].text for c in token_chunks) == text
    assert [c.choices[0].finish_reason for c in token_chunks][-1] == reason
    assert all(c.choices[0].finish_reason is None for c in token_chunks[:-1])
    usage = chunks[-1]
    assert not usage.choices and usage.usage.completion_tokens == len(ids)


def test_a_batch_of_prompts_gets_one_choice_each(server, offline):
    srv, _ = server
    result = client_for(srv).completions.create(
        model="tiny", prompt=PROMPTS[:3], max_tokens=6, temperature=0
    )
    assert [c.index for c in result.choices] == [0, 1, 2]
    for prompt, choice in zip(PROMPTS, result.choices):
        assert choice.text == offline_tokens(offline, prompt, 6)[1]


def test_chat_uses_the_template_whole_and_streamed(server, offline):
    srv, _ = server
    client = client_for(srv)
    messages = [{"role": "user", "content": "hi"}]
    rendered = "user: hi\nassistant:"
    ids, text, reason = offline_tokens(offline, list(rendered.encode()), 8)
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0
    )
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (text, reason)
    assert whole.usage.prompt_tokens == len(rendered)
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == reason


def test_models_lists_the_served_model(server):
    srv, _ = server
    models = client_for(srv).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].max_model_len == 256


@pytest.mark.parametrize(
    "options, error, param",
    [
        (dict(model="gpt-4"), openai.NotFoundError, "model"),
        (dict(max_tokens=0), openai.BadRequestError, "max_tokens"),
        (dict(max_tokens=500), openai.BadRequestError, "max_tokens"),  # beyond the context
        (dict(temperature=-1), openai.BadRequestError, "temperature"),
        (dict(top_p=0), openai.BadRequestError, "top_p"),
        (dict(prompt="x" * 300), openai.BadRequestError, "prompt"),  # longer than 256
        (dict(prompt=[999]), openai.BadRequestError, "prompt"),  # outside the vocabulary
        (dict(prompt=""), openai.BadRequestError, "prompt"),
        (dict(n=0), openai.BadRequestError, "n"),
        (dict(stop=[""]), openai.BadRequestError, "stop"),
        (dict(temperature="hot"), openai.BadRequestError, "temperature"),  # vLLM: 400, not 422
    ],
)
def test_bad_requests_get_openai_errors(server, options, error, param):
    srv, _ = server
    request = dict(model="tiny", prompt="hello", max_tokens=4) | options
    with pytest.raises(error) as caught:
        client_for(srv).completions.create(**request)
    body = caught.value.body
    assert set(body) == {"message", "type", "param", "code"}, body
    assert body["param"] == param and body["code"] == caught.value.status_code
    assert len(body["message"]) > 20  # says what is wrong and what to do


def test_malformed_bodies_and_unknown_paths(server):
    srv, _ = server
    url = srv.url
    missing = httpx.post(f"{url}/v1/completions", json={"model": "tiny"})
    assert missing.status_code == 400  # a schema error: vLLM's 400, not FastAPI's 422
    assert missing.json()["error"]["param"] == "prompt"
    assert "lacks `prompt`" in missing.json()["error"]["message"]
    no_messages = httpx.post(f"{url}/v1/chat/completions", json={"messages": []})
    assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
    not_json = httpx.post(
        f"{url}/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    nowhere = httpx.get(f"{url}/v2/models")
    assert nowhere.status_code == 404 and "/v1/completions" in nowhere.json()["error"]["message"]


def test_bad_requests_do_not_disturb_a_stream_in_flight(server, offline):
    srv, _ = server
    client = client_for(srv)
    stream = client.completions.create(
        model="tiny", prompt=PROMPTS[7], max_tokens=40, temperature=0, stream=True
    )
    pieces = [next(iter(stream)).choices[0].text]
    for bad in (dict(max_tokens=-3), dict(model="nope"), dict(temperature=-2)):
        with pytest.raises(openai.APIStatusError):
            client.completions.create(**(dict(model="tiny", prompt="x") | bad))
    pieces += [c.choices[0].text for c in stream]
    assert "".join(pieces) == offline_tokens(offline, PROMPTS[7], 40)[1]


# -- load, disconnects, warm-up, failures ----------------------------------------------------


def test_64_concurrent_streams_equal_the_offline_llm_and_free_every_block(server, offline):
    srv, async_llm = server
    max_tokens = [8 + i % 17 for i in range(64)]  # 8..24

    async def one(client, i):
        stream = await client.completions.create(
            model="tiny",
            prompt=PROMPTS[i],
            max_tokens=max_tokens[i],
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True},
        )
        ids, text, reason = [], "", None
        async for chunk in stream:
            choice = chunk.choices[0]
            ids += choice.token_ids
            text += choice.text
            reason = choice.finish_reason or reason
        return ids, text, reason

    async def load():
        client = openai.AsyncOpenAI(
            base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60
        )
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    start = time.perf_counter()
    served = asyncio.run(load())
    seconds = time.perf_counter() - start
    reference = [
        (o.token_ids, o.text, o.finish_reason)
        for o in offline.generate(
            PROMPTS,
            [SamplingParams(temperature=0, max_tokens=m) for m in max_tokens],
            use_tqdm=False,
        )
    ]
    equal = sum(s == r for s, r in zip(served, reference))
    wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")
    blocks = async_llm.llm.engine.block_manager
    print(
        f"\nload test: 64 streaming requests in {seconds:.2f} s; {equal}/64 equal to the "
        f"offline LLM; {blocks.num_free_blocks}/{blocks.num_blocks} KV blocks free after"
    )
    assert equal == 64, [i for i, (s, r) in enumerate(zip(served, reference)) if s != r]


@pytest.fixture(scope="module")
def slow_server():
    """A server whose every engine step takes 20 ms more: time to disconnect mid-stream."""
    with serving(slow_engine) as pair:
        yield pair


def _metric(server, name: str, **labels: str) -> float:
    """A metric's value in the server's /metrics (summed over the samples that match)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics").text
    samples = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    assert samples, f"/metrics has no {name} {labels}"
    return sum(sample.value for sample in samples)


ABORTED = dict(name="mini_vllm:request_success_total", finished_reason="abort")


def test_a_client_that_disconnects_mid_stream_is_aborted(slow_server, offline):
    srv, async_llm = slow_server
    before = _metric(srv, **ABORTED)

    def steady(i, results):
        results[i] = client_for(srv).completions.create(
            model="tiny", prompt=PROMPTS[i], max_tokens=12, temperature=0
        )

    results = {}
    others = [threading.Thread(target=steady, args=(i, results)) for i in range(4)]
    body = dict(model="tiny", prompt="leaving", max_tokens=200, ignore_eos=True, stream=True)
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", srv.url + "/v1/completions", json=body) as response:
            for thread in others:
                thread.start()
            events = 0
            for line in response.iter_lines():
                events += line.startswith("data: ")
                if events == 3:
                    break
    # The connection is closed: the engine ends the request long before its 200 tokens.
    left = time.monotonic()
    wait_until(lambda: _metric(srv, **ABORTED) == before + 1, timeout=10, what="the abort")
    assert time.monotonic() - left < 3.0
    for thread in others:
        thread.join(30)
    for i in range(4):
        assert results[i].choices[0].text == offline_tokens(offline, PROMPTS[i], 12)[1]
    wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")


def test_a_whole_request_whose_client_gives_up_is_aborted(slow_server):
    srv, async_llm = slow_server
    before = _metric(srv, **ABORTED)
    body = dict(model="tiny", prompt="impatient", max_tokens=200, ignore_eos=True)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=0.5)
    wait_until(lambda: _metric(srv, **ABORTED) == before + 1, timeout=10, what="the abort")
    wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")


def test_health_is_503_until_the_warm_up_is_done():
    warmed_up = threading.Event()

    def slow_warm_up():
        assert warmed_up.wait(60)
        return LLM("tiny", **ENGINE)

    with serving(slow_warm_up, wait=False) as (srv, async_llm):
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "warming up" in health.json()["status"]
        with pytest.raises(openai.InternalServerError) as caught:
            client_for(srv).completions.create(model="tiny", prompt="early", max_tokens=2)
        assert caught.value.status_code == 503 and "/health" in caught.value.body["message"]
        assert httpx.get(srv.url + "/metrics").status_code == 200  # scraped during warm-up too
        warmed_up.set()
        wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, what="readiness")
        done = client_for(srv).completions.create(model="tiny", prompt="now", max_tokens=2)
        assert done.choices[0].finish_reason in ("length", "stop")
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client_for(srv).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )


def test_an_engine_that_fails_to_start_says_why():
    def broken():
        raise UserError("max_model_len 5000 is more than the model's 256 positions")

    with serving(broken, wait=False) as (srv, async_llm):
        wait_until(lambda: async_llm.startup_error is not None, what="the failure")
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "5000" in health.json()["error"]
        with pytest.raises(openai.InternalServerError, match="failed to start"):
            client_for(srv).completions.create(model="tiny", prompt="x", max_tokens=2)


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(offline):
    armed = threading.Event()

    def factory():
        llm = LLM("tiny", **ENGINE)
        execute = llm.engine.runner.execute_model

        def maybe_fail(*args, **kwargs):
            if armed.is_set():
                armed.clear()
                raise RuntimeError("injected fault in the forward")
            return execute(*args, **kwargs)

        llm.engine.runner.execute_model = maybe_fail
        return llm

    with serving(factory) as (srv, async_llm):
        client = client_for(srv)
        armed.set()
        with pytest.raises(openai.InternalServerError, match="injected fault") as caught:
            client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=5)
        assert caught.value.status_code == 500
        armed.set()
        stream = client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=5, stream=True
        )
        with pytest.raises(openai.APIError, match="injected fault"):
            list(stream)
        after = client.completions.create(
            model="tiny", prompt=PROMPTS[2], max_tokens=9, temperature=0
        )
        assert after.choices[0].text == offline_tokens(offline, PROMPTS[2], 9)[1]
        wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")
        assert _metric(srv, "mini_vllm:engine_step_failures_total") == 2


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_parse_and_agree_with_the_engine_statistics():
    from prometheus_client.parser import text_string_to_metric_families

    # A small cache (preemptions) and the CPU recording graphs (FULL and PIECEWISE steps).
    options = dict(ENGINE, num_kv_blocks=8, max_model_len=128, cudagraph_mode="full_and_piecewise")
    with serving(lambda: LLM("tiny", **options)) as (srv, async_llm):

        async def load():
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
            async with client:
                return await asyncio.gather(
                    *(
                        client.completions.create(
                            model="tiny",
                            prompt=PROMPTS[i],
                            max_tokens=40,
                            extra_body={"ignore_eos": True},
                            temperature=0,
                        )
                        for i in range(6)
                    )
                )

        results = asyncio.run(load())
        wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")
        families = {
            f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)
        }
        stats = async_llm.llm.engine.stats

    def value(name, **labels):
        samples = [
            s
            for f in families.values()
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert samples, f"{name} {labels} is missing"
        return sum(s.value for s in samples)

    assert all(name.startswith("mini_vllm:") for name in families)
    assert stats.num_preemptions > 0
    assert value("mini_vllm:num_preemptions_total") == stats.num_preemptions
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    generated = sum(r.usage.completion_tokens for r in results)
    assert value("mini_vllm:prompt_tokens_total") == prompt_tokens
    assert value("mini_vllm:generation_tokens_total") == generated == 6 * 40
    for mode in ("NONE", "PIECEWISE", "FULL"):
        expected = stats.steps_per_runtime_mode.get(mode, 0)
        assert value("mini_vllm:engine_steps_total", mode=mode) == expected
    assert stats.steps_per_runtime_mode["FULL"] > 0
    assert value("mini_vllm:decode_graph_hit_rate") == pytest.approx(stats.decode_graph_hit_rate)
    assert value("mini_vllm:padding_waste") == pytest.approx(stats.padding_waste)
    assert value("mini_vllm:decode_steps_total") == stats.num_decode_steps
    assert value("mini_vllm:cudagraph_capture_seconds") > 0
    assert value("mini_vllm:cudagraph_num_graphs") > 0
    assert value("mini_vllm:request_success_total", finished_reason="length") == 6
    assert value("mini_vllm:time_to_first_token_seconds_count") == 6
    assert value("mini_vllm:inter_token_latency_seconds_count") == generated - 6
    assert value("mini_vllm:e2e_request_latency_seconds_count") == 6
    assert value("mini_vllm:num_requests_running") == value("mini_vllm:num_requests_waiting") == 0
    assert value("mini_vllm:kv_cache_usage_perc") == 0


# -- bench serve, and the command itself --------------------------------------------------------


def test_bench_serve_writes_its_report(server, tmp_path):
    from mini_vllm.__main__ import main
    from mini_vllm.bench.serve import main as combine_main

    srv, _ = server
    out, saved = tmp_path / "serve.md", tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", srv.url, "--num-prompts", "6"]
    argv += ["--random-input-len", "16", "--random-output-len", "8", "--request-rate", "50,inf"]
    argv += ["--goodput", "ttft:5000", "itl:5000", "--output", str(out), "--save-json", str(saved)]
    assert main(argv) == 0
    text = out.read_text()
    for needed in (
        "- date: ",
        "- machine: ",
        "- command: `python -m mini_vllm bench serve",
        "| 50 |",
    ):
        assert needed in text
    assert re.search(r"\| inf \| 6 \| 0 \|", text), text
    assert re.search(r"\| inf \| ITL \|", text)
    assert out.with_suffix(".png").stat().st_size > 10_000
    report = json.loads(saved.read_text())
    assert [run["metrics"]["completed"] for run in report["runs"]] == [6, 6]
    assert report["runs"][0]["metrics"]["goodput"] > 0
    assert report["runs"][0]["server"]["decode_graph_hit_rate"] == 0.0  # eager on CPU
    combined = tmp_path / "combined.md"
    assert combine_main(["combine", str(saved), str(saved), "--output", str(combined)]) == 0
    assert combined.read_text().count("| server | inf |") == 2


def serve_process(tmp_path, *flags: str) -> subprocess.Popen:
    """`python -m mini_vllm serve` on the tiny model in a child process, any free port, with
    the test chat template and `flags`; its output is read through pipes."""
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    command = [sys.executable, "-m", "mini_vllm", "serve", "--model", "tiny", "--port", "0"]
    command += ["--cpu-threads", "1", "--chat-template", str(template), *flags]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_the_serve_command_answers_and_stops_on_sigterm(tmp_path):
    process = serve_process(tmp_path)
    try:
        url = re.search(r"at (http://\S+?)/v1 ", process.stdout.readline()).group(1)
        wait_until(
            lambda: _status(url + "/health") == 200, timeout=60, what="the server's readiness"
        )
        answer = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        ).json()
        assert answer["choices"][0]["message"]["role"] == "assistant"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert "Shutting down" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_serve_has_a_flag_for_every_engine_option():
    from mini_vllm.cli.serve import config_fields_without_flag

    assert config_fields_without_flag() == []


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-num-seqs", "0"], "max_num_seqs must be"),
        (["--model", "nonsense"], "nonsense"),
        (["--chat-template", "not a template"], "neither a file nor a Jinja template"),
    ],
)
def test_serve_refuses_bad_options_before_listening(flags, message, capsys):
    from mini_vllm.__main__ import main

    assert main(["serve", "--port", "0", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_duplicate_request_id_is_refused_and_the_first_request_goes_on(offline):
    async_llm = AsyncLLM(lambda: LLM("tiny", **ENGINE))
    async_llm.start()
    try:
        assert async_llm.wait_ready(120), async_llm.startup_error
        prompt = [5, 6, 7, 8]
        params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

        async def collect(request_id, started=None):
            tokens, last = [], None
            async with contextlib.aclosing(
                async_llm.generate(request_id, prompt, params)
            ) as deltas:
                async for delta in deltas:
                    tokens += delta.new_token_ids
                    last = delta
                    if started is not None:
                        started.set()
            return tokens, last

        async def both():
            started = asyncio.Event()
            first = asyncio.ensure_future(collect("same-id", started))
            await started.wait()  # the first request is running in the engine
            second = await collect("same-id")
            return await first, second

        (tokens, last), (_, refused) = asyncio.run(both())
        assert refused.status_code == 400 and "same-id" in refused.error
        assert last.finish_reason == "length"
        assert tokens == offline.generate([prompt], params, use_tqdm=False)[0].token_ids
        wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")
    finally:
        async_llm.shutdown()
