"""The server under requests meant to hurt it: a prompt of megabytes (the event loop stays free:
`/health` answers while it is tokenized), a body over the size limit (413), error messages that
would echo megabytes back (cut short); validation as vLLM's (400 for a schema error, 0 tokens
refused, the combinations vLLM refuses, every field the server does not serve refused by name,
typos too, `model` optional, lone surrogates a 400); the API key and the Host check; and
shutdown, where every stream still running ends with an error event and `data: [DONE]`, in a
thread and in the `serve` command stopped by SIGTERM.

Servers run the `tiny` model, in a thread of the test process (the helpers of test_serve.py),
except the SIGTERM test's, a child process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import threading
import time
import types

import httpx
import openai
import pytest

from mini_vllm import LLM
from mini_vllm.entrypoints.async_llm import AsyncLLM
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.entrypoints.openai.api_server import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    ServerThread,
    build_app,
)
from tests.engine.test_serve import (
    CHAT_TEMPLATE,
    ENGINE,
    _metric,
    _status,
    client_for,
    engine_idle_and_free,
    serve_process,
    serving,
    slow_engine,
    wait_until,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def server():
    with serving(lambda: LLM("tiny", **ENGINE), chat_template=CHAT_TEMPLATE) as pair:
        yield pair


@contextlib.contextmanager
def serving_with(factory, shutdown_timeout=5.0, **app_options):
    """`serving`, with build_app's guards (api_keys, allowed_hosts, max_request_body_bytes)
    and ServerThread's shutdown timeout."""
    async_llm = AsyncLLM(factory, metrics=PrometheusStatLogger("tiny"))
    app = build_app(async_llm, "tiny", chat_template=CHAT_TEMPLATE, **app_options)
    with ServerThread(app, shutdown_timeout=shutdown_timeout) as srv:
        assert async_llm.wait_ready(120), async_llm.startup_error
        yield srv, async_llm


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> str:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    if param is not None:
        assert error["param"] == param, error
    assert len(error["message"]) > 20  # says what is wrong and what to do
    return error["message"]


def health_latencies_while(url: str, send) -> tuple[list[float], float, object]:
    """Run `send()` in a thread while polling the server's /health: the latencies of the
    polls, the seconds `send` took, and what it returned."""
    result: dict[str, object] = {}

    def run():
        start = time.perf_counter()
        result["value"] = send()
        result["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=run)
    latencies = []
    with httpx.Client(timeout=60) as http:
        assert http.get(url + "/health").status_code == 200  # connected before the work
        thread.start()
        while thread.is_alive():
            start = time.perf_counter()
            assert http.get(url + "/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
    thread.join()
    return latencies, result["seconds"], result["value"]


# -- a request's size never blocks the event loop --------------------------------------------------


class SlowTokenizer:
    """The model's tokenizer, whose encode first spends `seconds` in pure Python, as a
    tokenizer working through a prompt of megabytes would (holding the GIL between switches)."""

    def __init__(self, inner, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:
            pass
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_health_answers_while_a_prompt_is_tokenized(endpoint):
    encode_seconds = 1.5

    def factory():
        llm = LLM("tiny", **ENGINE)
        llm.tokenizer = SlowTokenizer(llm.tokenizer, encode_seconds)
        return llm

    with serving_with(factory) as (srv, _):
        client = client_for(srv, timeout=60)

        def send():
            if endpoint == "completions":
                return client.completions.create(model="tiny", prompt="hello", max_tokens=4)
            messages = [{"role": "user", "content": "hi"}]
            return client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)

        latencies, seconds, answer = health_latencies_while(srv.url, send)
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert seconds >= encode_seconds
    # On the event loop, the tokenizer would hold /health for the whole 1.5 s.
    assert len(latencies) >= 5 and max(latencies) < 0.5, (max(latencies), seconds)


@pytest.mark.parametrize("kind", ["text", "token ids"])
def test_a_prompt_of_megabytes_is_refused_at_once_and_health_goes_on(server, kind):
    srv, async_llm = server
    # 12 MiB of text, 4 MiB of ids ("97," a token): tokenized and checked id by id, the text
    # would hold the event loop for seconds.
    prompt = "a" * (12 * MIB) if kind == "text" else [97] * (4 * MIB // 3)

    def send():
        return httpx.post(
            srv.url + "/v1/completions", json={"model": "tiny", "prompt": prompt}, timeout=120
        )

    latencies, seconds, response = health_latencies_while(srv.url, send)
    message = assert_openai_error(response, 400, "prompt")
    assert "maximum context length is 256" in message and len(response.content) < 1000
    assert max(latencies, default=0) < 0.5 and seconds < 5, (latencies, seconds)
    wait_until(lambda: engine_idle_and_free(async_llm), what="every block free")


def _raw_http(port: int, head: bytes, body_chunks=()) -> bytes:
    """Send a request's head and body chunks on a plain socket; the whole answer (the head
    asks for `Connection: close`: the server closes once it has answered)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            sock.sendall(chunk)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _json_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():  # one chunk: its size, then the JSON
        body = body.split(b"\r\n", 1)[1]
    return status, json.JSONDecoder().raw_decode(body.decode())[0]


def test_a_body_over_the_limit_gets_413_from_its_length_or_as_it_arrives(server):
    srv, _ = server
    # Content-Length over the default 16 MiB: refused before a byte of the body is read.
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {17 * MIB}\r\n\r\n"
    ).encode()
    status, body = _json_of(_raw_http(srv.port, head))
    assert status == 413 and body["error"]["code"] == 413
    assert str(16 * MIB) in body["error"]["message"]
    assert "--max-request-body-bytes" in body["error"]["message"]
    # A chunked body has no length: refused once the bytes received pass the limit.
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nConnection: close\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    # Exactly the limit in 1 MiB chunks, then 1 KiB more, and no last chunk: the server reads
    # all that was sent (so it closes cleanly) and answers before the body ends.
    chunks = [b"%x\r\n%s\r\n" % (size, b"x" * size) for size in [MIB] * 16 + [1024]]
    status, body = _json_of(_raw_http(srv.port, head, chunks))
    assert status == 413 and str(16 * MIB) in body["error"]["message"]
    # A client that sends the whole body reads the 413 too, and its connection serves on.
    with httpx.Client(timeout=60) as http:
        headers = {"content-type": "application/json"}
        response = http.post(srv.url + "/v1/completions", content=b"x" * 17 * MIB, headers=headers)
        assert_openai_error(response, 413)
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        assert http.post(srv.url + "/v1/completions", json=body).status_code == 200


@pytest.mark.parametrize(
    "body, status, param",
    [
        (dict(model="tiny", prompt="hi", temperature="x" * MIB), 400, "temperature"),
        (dict(model="tiny", prompt=["a", 1] * (MIB // 8)), 400, "prompt"),  # an error an item
        (dict(model="tiny", messages=[{"role": 1}] * (MIB // 16)), 400, "messages"),
        (dict(model="m" * MIB, prompt="hi"), 404, "model"),
        (dict(model="tiny", prompt="hi", **{"y" * MIB: 1}), 400, None),
        (dict(model="tiny", prompt="hi", stream=True, stream_options={"z" * MIB: 1}), 400, None),
    ],
)
def test_an_error_quotes_a_huge_field_only_in_part(server, body, status, param):
    srv, _ = server
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    start = time.perf_counter()
    response = httpx.post(srv.url + path, json=body, timeout=60)
    seconds = time.perf_counter() - start
    assert_openai_error(response, status, param)
    assert len(response.content) < 1500, len(response.content)
    # One error, not one per item: building 100,000 of them would hold the event loop.
    assert seconds < 1.0, seconds


# -- validation as vLLM's --------------------------------------------------------------------------


def _chat(client, **options):
    request = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return client.chat.completions.create(**(request | options))


def _completion(client, **options):
    return client.completions.create(**(dict(model="tiny", prompt="hello", max_tokens=4) | options))


@pytest.mark.parametrize(
    "send, options, param, says",
    [
        (_chat, dict(max_completion_tokens=0), "max_completion_tokens", "at least 1"),
        (_chat, dict(max_tokens=0), "max_tokens", "at least 1"),
        (_completion, dict(max_tokens=0), "max_tokens", "at least 1"),
        (_completion, dict(stream_options={"include_usage": True}), "stream_options", "stream"),
        (_chat, dict(stream_options={"include_usage": True}), "stream_options", "stream"),
        (_chat, dict(top_logprobs=3), "top_logprobs", "logprobs"),
        (_chat, dict(extra_body={"repetition_penalty": 0}), "repetition_penalty", "> 0"),
        (_chat, dict(extra_body={"min_p": 1.5}), "min_p", "[0, 1]"),
        (_completion, dict(extra_body={"stop_token_ids": [-5]}), "stop_token_ids", ">= 0"),
        (_completion, dict(extra_body={"min_tokens": 9}), "min_tokens", "max_tokens=4"),
        (_completion, dict(logprobs=21), "logprobs", "[0, 20]"),
        (_chat, dict(logprobs=True, top_logprobs=21), "top_logprobs", "0 to 20"),
        (_completion, dict(extra_body={"prompt_logprobs": 21}), "prompt_logprobs", "[0, 20]"),
        (_chat, dict(extra_body={"echo": True}), "echo", "not support"),
        (_completion, dict(n=129), "n", "at most 128"),
        (_completion, dict(prompt=["a"] * 600, n=2), "n", "split it"),
        (_completion, dict(prompt=[[5]] * 1025), "prompt", "split it"),
        (_completion, dict(best_of=2), "best_of", "not support"),
        (_chat, dict(extra_body={"prompt_logprobs": 1}), "prompt_logprobs", "not support"),
        (_completion, dict(logit_bias={"five": 1.0}), "logit_bias", "token id"),
        (_completion, dict(logit_bias={"5": 101}), "logit_bias", "[-100, 100]"),
        (_chat, dict(presence_penalty=2.5), "presence_penalty", "[-2, 2]"),
        (_chat, dict(frequency_penalty=-2.5), "frequency_penalty", "[-2, 2]"),
        (_chat, dict(n=0), "n", ">= 1"),
        (_completion, dict(stop=[""]), "stop", "non-empty"),
        (_completion, dict(extra_body={"max_token": 9}), "max_token", "unknown field"),
        (_chat, dict(extra_body={"temprature": 0}), "temprature", "spelling"),
        (_completion, dict(stream=True, stream_options={"x": 1}), "stream_options", "unknown"),
    ],
)
def test_what_vllm_refuses_is_refused_by_name(server, send, options, param, says):
    srv, _ = server
    with pytest.raises(openai.BadRequestError) as caught:
        send(client_for(srv), **options)
    body = caught.value.body
    assert body["param"] == param and body["code"] == 400, body
    assert says in body["message"], body["message"]


def test_fields_at_their_neutral_values_are_accepted(server):
    srv, _ = server
    client = client_for(srv)
    neutral = dict(n=1, presence_penalty=0, frequency_penalty=0.0, stop=None, logit_bias={})
    neutral |= dict(user="someone", extra_body={"repetition_penalty": 1.0, "min_p": 0})
    assert _chat(client, logprobs=False, top_logprobs=0, **neutral).choices
    assert _completion(client, echo=False, best_of=1, **neutral).choices


def test_model_may_be_left_out_and_a_wrong_one_is_404(server):
    srv, _ = server
    url = srv.url
    whole = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3})
    assert whole.status_code == 200 and whole.json()["model"] == "tiny"
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        timeout=60,
    )
    assert chat.status_code == 200 and chat.json()["model"] == "tiny"
    with pytest.raises(openai.NotFoundError) as caught:
        _completion(client_for(srv), model="gpt-4")
    assert caught.value.body["param"] == "model"


@pytest.mark.parametrize(
    "path, body, param",
    [  # JSON text: the escapes reach the server as lone surrogates, the test's ids stay ASCII
        ("/v1/completions", r'{"model": "tiny", "prompt": "bad \ud800 text"}', "prompt"),
        ("/v1/completions", r'{"model": "tiny", "prompt": ["fine", "lone \udfff"]}', "prompt"),
        (
            "/v1/chat/completions",
            r'{"model": "tiny", "messages": [{"role": "user", "content": "\ud83d!"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            r'{"model": "tiny", "messages": [{"role": "\udc00", "content": "hi"}]}',
            "messages[0].role",
        ),
        ("/v1/completions", r'{"model": "\ud800", "prompt": "hi"}', "model"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    srv, _ = server
    headers = {"content-type": "application/json"}
    response = httpx.post(srv.url + path, content=body, headers=headers)
    status = 404 if param == "model" else 400
    message = assert_openai_error(response, status, param)
    assert param == "model" or "surrogate" in message


def test_a_body_that_is_not_utf8_is_a_400(server):
    srv, _ = server
    response = httpx.post(
        srv.url + "/v1/completions",
        content=b'{"model": "tiny", "prompt": "\xff\xfe"}',
        headers={"content-type": "application/json"},
    )
    assert "UTF-8" in assert_openai_error(response, 400)


# -- the API key and the Host check ----------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded_server():
    options = dict(api_keys=["sekret", "other"], allowed_hosts=["localhost", "127.0.0.1"])
    with serving_with(lambda: LLM("tiny", **ENGINE), **options) as pair:
        yield pair


def test_the_api_key_guards_v1_and_leaves_health_and_metrics_open(guarded_server):
    srv, _ = guarded_server
    base = srv.url + "/v1"
    client = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    body = caught.value.body
    assert body["code"] == 401 and "wrong API key" in body["message"]
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    without = httpx.post(base + "/completions", json={"prompt": "hi"})  # no Authorization
    assert "Authorization: Bearer" in assert_openai_error(without, 401)
    for key in ("sekret", "other"):
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
        assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
        assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 200
    assert httpx.post(base + "/completions", json={}).status_code == 401  # before the schema
    preflight = httpx.options(base + "/completions", headers={"Origin": "http://x.example"})
    assert preflight.status_code != 401  # CORS preflights pass, as in vLLM (and get no CORS)
    assert "access-control-allow-origin" not in preflight.headers


def test_a_host_the_server_does_not_answer_to_is_refused(guarded_server):
    srv, _ = guarded_server
    auth = {"Authorization": "Bearer sekret"}
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example"):
        response = httpx.get(srv.url + "/v1/models", headers={**auth, "Host": host})
        assert "--allowed-hosts" in assert_openai_error(response, 400)
    assert httpx.get(srv.url + "/health", headers={"Host": "evil.example"}).status_code == 400
    for host in (f"localhost:{srv.port}", f"127.0.0.1:{srv.port}", "LOCALHOST"):
        response = httpx.get(srv.url + "/v1/models", headers={**auth, "Host": host})
        assert response.status_code == 200


def _serve_args(*flags: str) -> argparse.Namespace:
    from mini_vllm.cli.serve import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *flags])


def test_serve_flags_for_the_key_the_hosts_and_the_body_limit(monkeypatch):
    from mini_vllm.cli.serve import access_options
    from mini_vllm.errors import UserError

    monkeypatch.delenv("MINI_VLLM_API_KEY", raising=False)
    default = access_options(_serve_args(), "127.0.0.1")
    assert default == dict(
        api_keys=None,
        allowed_hosts=["localhost", "127.0.0.1", "::1"],
        max_request_body_bytes=16 * MIB,
    )
    assert DEFAULT_MAX_REQUEST_BODY_BYTES == 16 * MIB  # api_server's, which serve repeats
    assert access_options(_serve_args(), "0.0.0.0")["allowed_hosts"] is None  # as vLLM
    hosts = access_options(_serve_args("--allowed-hosts", "a.example", "*.b.example"), "10.0.0.5")
    assert hosts["allowed_hosts"] == ["a.example", "*.b.example", "10.0.0.5"]
    monkeypatch.setenv("MINI_VLLM_API_KEY", "from-env")
    assert access_options(_serve_args(), "127.0.0.1")["api_keys"] == ["from-env"]
    flagged = access_options(_serve_args("--api-key", "k1", "k2"), "127.0.0.1")
    assert flagged["api_keys"] == ["k1", "k2"]  # the flag over the environment
    for flags in (["--max-request-body-bytes", "0"], ["--api-key", " "]):
        with pytest.raises(UserError):
            access_options(_serve_args(*flags), "127.0.0.1")


# -- shutdown ends every stream with an error event and [DONE] -------------------------------------


def _read_events(url: str, body: dict, events: list, started: threading.Event) -> None:
    """The `data:` payloads of one stream, into `events` (None last if it was cut); `started`
    is set at the first."""
    try:
        with httpx.stream("POST", url, json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
                    started.set()
    except httpx.HTTPError:
        events.append(None)
    finally:
        started.set()


def _ends_with_an_error_and_done(events: list) -> bool:
    return (
        len(events) >= 2
        and events[-1] == "[DONE]"
        and events[-2] is not None
        and "error" in json.loads(events[-2])
    )


def test_stopping_the_server_ends_streams_past_the_timeout_with_an_error_and_done():
    with serving_with(slow_engine, shutdown_timeout=1.0) as (srv, _):
        url = srv.url + "/v1/completions"
        threads, streams = [], []
        for max_tokens in (10, 200, 200):
            events, started = [], threading.Event()
            body = dict(model="tiny", prompt="go", max_tokens=max_tokens, ignore_eos=True)
            body["stream"] = True
            thread = threading.Thread(target=_read_events, args=(url, body, events, started))
            thread.start()
            assert started.wait(30)
            threads.append(thread)
            streams.append(events)
        start = time.monotonic()
    stopped = time.monotonic() - start
    for thread in threads:
        thread.join(30)
    short, *long = streams
    assert short[-1] == "[DONE]" and json.loads(short[-2])["choices"][0]["finish_reason"]
    assert all(_ends_with_an_error_and_done(events) for events in long), long
    assert "shutting down" in json.loads(long[0][-2])["error"]["message"]
    assert stopped < 4.0  # the timeout, then the error: not the streams' 4 s


def test_sigterm_ends_every_stream_with_an_error_event_and_done(tmp_path):
    process = serve_process(tmp_path, "--max-num-seqs", "1", "--shutdown-timeout", "0")
    threads = []
    try:
        url = re.search(r"at (http://\S+?)/v1 ", process.stdout.readline()).group(1)
        wait_until(lambda: _status(url + "/health") == 200, timeout=60, what="readiness")

        # One request at a time (--max-num-seqs 1), four long whole ones first: the streams
        # wait behind them, in flight, while SIGTERM is handled.
        blockers: list[list[httpx.Response]] = [[] for _ in range(4)]
        whole = dict(model="tiny", prompt="x", max_tokens=250, ignore_eos=True)

        def send_whole(answer: list) -> None:
            answer.append(httpx.post(url + "/v1/completions", json=whole, timeout=60))

        for answer in blockers:
            thread = threading.Thread(target=send_whole, args=(answer,))
            thread.start()
            threads.append(thread)
        served = types.SimpleNamespace(url=url)
        wait_until(
            lambda: _metric(served, "mini_vllm:num_requests_waiting") >= 2,
            what="two whole requests waiting in the engine",
        )
        streams = []
        body = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True)
        for _ in range(4):
            events, started = [], threading.Event()
            args = (url + "/v1/chat/completions", body, events, started)
            thread = threading.Thread(target=_read_events, args=args)
            thread.start()
            assert started.wait(30)  # the first event, the role, is out
            threads.append(thread)
            streams.append(events)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        for thread in threads:
            thread.join(30)
        for events in streams:
            assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
            assert _ends_with_an_error_and_done(events), events[-3:]
        # The one running may have finished in time; the others end with an error, not cut.
        statuses = sorted(answer[0].status_code for answer in blockers)
        assert statuses[-1] == 503 and set(statuses) <= {200, 503}, statuses
        log = process.stderr.read()
        assert "Shutting down" in log and "ending them with an error" in log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
