"""`bench serve`'s sampling options and API key: the request body built for a set of options,
the checks of the options at parse time, `Authorization: Bearer KEY` on every request the
benchmark makes, a 401 as an error naming --api-key, and the key kept out of the report and
its JSON. Most tests load a fake OpenAI-compatible server (a thread of this process that
records every request and streams three tokens); the last one starts `python -m mini_vllm
serve` with the tiny model, as the benchmark does without --base-url."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mini_vllm.__main__ import main
from mini_vllm.bench.serve import (
    GREEDY,
    SampleRequest,
    ServeBenchReport,
    format_sampling,
    parse_extra_body,
    request_body,
    sampling_options,
)
from mini_vllm.errors import UserError

KEY = "sk-test-0123456789abcdef"
REQUEST = SampleRequest(prompt=[1, 2, 3], prompt_len=3, output_len=4)


# -- the request body ---------------------------------------------------------------------------


def test_the_default_body_is_greedy_and_sends_no_other_sampling_field():
    body = request_body("m", REQUEST, ignore_eos=True, sampling=sampling_options())
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 4,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "return_token_ids": True,
    }
    assert request_body("m", REQUEST, ignore_eos=True) == body  # no sampling given: greedy


def test_the_options_given_and_the_extra_body_are_sent_and_no_others():
    extra = parse_extra_body('{"stop": ["\\n\\n"], "logprobs": 2}')
    sampling = sampling_options(extra, temperature=0.6, top_p=0.9, top_k=20, min_p=None)
    assert sampling == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    body = request_body("m", REQUEST, ignore_eos=False, sampling={**sampling, **extra})
    assert body["stop"] == ["\n\n"] and body["logprobs"] == 2
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.6, 0.9, 20)
    assert "min_p" not in body and "repetition_penalty" not in body
    assert (body["stream"], body["max_tokens"], body["ignore_eos"]) == (True, 4, False)


def test_every_sampling_flag_has_its_api_name():
    values = dict(
        temperature=1.0,
        top_p=0.5,
        top_k=3,
        min_p=0.1,
        presence_penalty=0.2,
        frequency_penalty=0.3,
        repetition_penalty=1.1,
    )
    assert sampling_options(**values) == values


def test_the_extra_body_may_give_the_temperature_when_the_flag_does_not():
    extra = {"temperature": 0.7}
    assert sampling_options(extra) == {}
    assert request_body("m", REQUEST, True, {**sampling_options(extra), **extra})["temperature"]


def test_the_report_line_says_what_was_sampled():
    assert format_sampling(GREEDY) == "greedy"
    assert format_sampling({"temperature": 0.6, "top_p": 0.9}, {"stop": ["\n\n"]}) == (
        'temperature 0.6, top_p 0.9, extra body `{"stop": ["\\n\\n"]}`'
    )
    old = json.loads(_report_json())  # a result saved before the options existed: greedy
    assert ServeBenchReport.from_json(json.dumps(old)).sampling == GREEDY


def _report_json() -> str:
    report = ServeBenchReport(
        label="x",
        command="c",
        machine="m",
        base_url="u",
        model="tiny",
        engine_args=None,
        dataset={},
        max_concurrency=None,
        percentiles=[50.0],
        goodput_slo_ms={},
        runs=[],
    )
    data = json.loads(report.to_json())
    del data["sampling"], data["extra_body"]
    return json.dumps(data)


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("{stop: 1}", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ('{"prompt": "x"}', "sets prompt, which the benchmark sets itself"),
        ('{"stream": false}', "sets stream,"),
        ('{"max_tokens": 9, "model": "m"}', "sets model, max_tokens,"),
        ('{"ignore_eos": false}', "sets ignore_eos,"),
        ('{"stream_options": {}}', "sets stream_options,"),
    ],
)
def test_a_bad_extra_body_is_refused_by_name(text, message):
    with pytest.raises(UserError, match=message):
        parse_extra_body(text)


def test_a_field_given_by_a_flag_and_in_the_extra_body_is_refused():
    with pytest.raises(UserError, match="top_p given twice, by --top-p and in --extra-body"):
        sampling_options({"top_p": 0.5}, top_p=0.9)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--extra-body", "{oops"], "argument --extra-body: is not valid JSON"),
        (["--extra-body", '{"stream": false}'], "sets stream, which the benchmark sets itself"),
        (["--top-p", "high"], "argument --top-p: 'high' is not a number"),
        (["--temperature", "nan"], "argument --temperature: 'nan': give a finite number"),
        (["--top-k", "0.5"], "argument --top-k: invalid int value"),
    ],
)
def test_bad_options_are_argparse_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--no-output", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-p", "0.1", "--extra-body", '{"min_p": 0.2}'], "min_p given twice"),
        (["--api-key", " "], "--api-key is empty"),
    ],
)
def test_conflicting_options_fail_before_any_request(flags, message, capsys):
    argv = ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--no-output", *flags]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


# -- against a fake server ----------------------------------------------------------------------


class _Recorded:
    def __init__(self, key: str | None) -> None:
        self.key = key
        self.requests: list[tuple[str, str | None, dict | None]] = []  # path, auth, body
        self.lock = threading.Lock()


def _handler(recorded: _Recorded):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self, body: dict | None) -> bool:
            auth = self.headers.get("Authorization")
            with recorded.lock:
                recorded.requests.append((self.path, auth, body))
            wanted = recorded.key is None or auth == f"Bearer {recorded.key}"
            if not wanted and self.path.startswith("/v1"):
                self._answer(401, b'{"error": {"message": "no API key", "code": 401}}')
                return False
            return True

        def do_GET(self) -> None:
            if not self._record(None):
                return
            if self.path == "/v1/models":
                self._answer(200, b'{"object": "list", "data": [{"id": "fake"}]}')
            elif self.path in ("/metrics", "/health"):
                self._answer(200, b"", "text/plain")
            else:
                self._answer(404, b"{}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            if not self._record(body):
                return
            chunks = [{"choices": [{"index": 0, "text": "a", "token_ids": [7]}]}] * 3
            chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@contextlib.contextmanager
def fake_server(key: str | None = None):
    """(url, recorded) of a fake OpenAI-compatible server; with `key`, /v1 wants it."""
    recorded = _Recorded(key)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorded))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", recorded
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def _bench(url: str, tmp_path: Path, *flags: str) -> list[str]:
    argv = ["bench", "serve", "--base-url", url, "--num-prompts", "3"]
    argv += ["--random-input-len", "4", "--random-output-len", "3"]
    argv += ["--output", str(tmp_path / "serve.md"), "--save-json", str(tmp_path / "serve.json")]
    return argv + list(flags)


def test_the_key_goes_with_every_request_and_the_options_in_every_body(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    extra = '{"stop": ["\\n\\n"], "logprobs": 2}'
    with fake_server(KEY) as (url, recorded):
        flags = ["--api-key", KEY, "--temperature", "0.6", "--top-p", "0.9", "--top-k", "20"]
        assert main(_bench(url, tmp_path, *flags, "--extra-body", extra)) == 0
    paths = [path for path, _, _ in recorded.requests]
    assert {"/v1/models", "/metrics", "/v1/completions"} <= set(paths)
    assert paths.count("/v1/completions") == 4  # the warm-up request, then 3
    assert all(auth == f"Bearer {KEY}" for _, auth, _ in recorded.requests)
    for _, _, body in recorded.requests:
        if body is not None:
            assert (body["temperature"], body["top_p"], body["top_k"]) == (0.6, 0.9, 20)
            assert body["stop"] == ["\n\n"] and body["logprobs"] == 2
            assert body["model"] == "fake" and body["stream"] is True
            assert not {"min_p", "presence_penalty", "repetition_penalty"} & set(body)
    text = (tmp_path / "serve.md").read_text()
    assert (
        '- sampling: temperature 0.6, top_p 0.9, top_k 20, extra body `{"stop": ["\\n\\n"], '
        '"logprobs": 2}`' in text
    )
    assert "--temperature 0.6 --top-p 0.9 --top-k 20 --extra-body" in text  # the command
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["sampling"] == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert saved["extra_body"] == {"stop": ["\n\n"], "logprobs": 2}
    out = capsys.readouterr()
    for where in (text, (tmp_path / "serve.json").read_text(), out.out, out.err):
        assert KEY not in where


def test_the_key_defaults_to_openai_api_key_and_greedy_is_the_default(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with fake_server(KEY) as (url, recorded):
        assert main(_bench(url, tmp_path)) == 0
    assert all(auth == f"Bearer {KEY}" for _, auth, _ in recorded.requests)
    bodies = [body for _, _, body in recorded.requests if body is not None]
    sampling = {"temperature", "top_p", "top_k", "min_p", "presence_penalty"}
    assert all(sampling & set(body) == {"temperature"} for body in bodies)
    assert all(body["temperature"] == 0.0 for body in bodies)
    text = (tmp_path / "serve.md").read_text()
    assert "- sampling: greedy\n" in text and KEY not in text
    assert KEY not in capsys.readouterr().out


def test_no_key_sends_no_authorization_header(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with fake_server() as (url, recorded):
        assert main(_bench(url, tmp_path, "--no-output")) == 0
    assert recorded.requests and all(auth is None for _, auth, _ in recorded.requests)


@pytest.mark.parametrize("model_flags", [[], ["--served-model-name", "fake"]])  # models, warm-up
@pytest.mark.parametrize(
    "key_flags, message",
    [
        ([], "wants an API key (HTTP 401): pass it with --api-key KEY"),
        (
            ["--api-key", "wrong"],
            ("refused the API key (HTTP 401): pass the key the server was started with, --api-key"),
        ),
    ],
)
def test_a_401_is_an_error_naming_api_key(
    model_flags, key_flags, message, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with fake_server(KEY) as (url, recorded):
        assert main(_bench(url, tmp_path, "--no-output", *model_flags, *key_flags)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(recorded.requests) == 1  # it stopped at the first refusal


# -- a server the benchmark starts --------------------------------------------------------------


def test_a_started_server_wants_the_benchmarks_key(tmp_path, capsys, monkeypatch):
    import tempfile

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MINI_VLLM_API_KEY", "someone-elses-key")  # not given to the server
    argv = ["bench", "serve", "--model", "tiny", "--cpu-threads", "1", "--num-prompts", "2"]
    argv += ["--random-input-len", "4", "--random-output-len", "3", "--api-key", KEY]
    argv += ["--temperature", "0.8", "--output", str(tmp_path / "serve.md")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    log = next(line for line in out.splitlines() if line.startswith("starting the server")).split(
        "(log: "
    )[1][:-1]
    assert "/v1 wants an API key" in Path(log).read_text()  # the server asked for one...
    assert Path(log).parent == Path(tempfile.gettempdir())
    text = (tmp_path / "serve.md").read_text()
    assert "| inf | 2 | 0 |" in text  # ...and every request had it
    assert "- sampling: temperature 0.8" in text
    assert KEY not in text and KEY not in out
