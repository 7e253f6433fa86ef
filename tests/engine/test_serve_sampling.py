"""The sampling options of vLLM's API through the server, with the official `openai` client:
each answer equals what the offline `LLM` gives for the same `SamplingParams`, whole and
streamed.

- The options that reshape the logits or end a request (penalties, min_p, logit_bias,
  min_tokens, stop_token_ids, seed): the same tokens as `LLM.generate`.
- `n`: n choices a prompt, numbered i * n + j for the j-th of prompt i, each the offline
  completion of the same index.
- Stop strings: the text cut where the first one appears (kept with
  include_stop_str_in_output), finish_reason "stop" and the string as stop_reason; a stream
  never sends text it would have to take back, so its pieces add up to the whole answer;
  the engine ends the request and frees its blocks.
- logprobs: the log-probabilities the offline engine returns, in OpenAI's completions form
  (tokens, token_logprobs, top_logprobs, text_offset) and chat form (content entries with
  bytes and top_logprobs).
"""

from __future__ import annotations

import math

import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.entrypoints.async_llm import RequestOutputDelta
from mini_vllm.entrypoints.openai.serving_engine import ChoiceState
from mini_vllm.tokenizer import IncrementalDetokenizer
from tests.engine.test_serve import (
    CHAT_TEMPLATE,
    ENGINE,
    client_for,
    engine_idle_and_free,
    serving,
    wait_until,
)

PROMPT = "prompt 5: abcabcabc"


@pytest.fixture(scope="module")
def offline():
    return LLM("tiny", **ENGINE)


@pytest.fixture(scope="module")
def server():
    with serving(lambda: LLM("tiny", **ENGINE), chat_template=CHAT_TEMPLATE) as pair:
        yield pair


def offline_outputs(offline, prompt, **options):
    return offline.generate([prompt], SamplingParams(**options), use_tqdm=False)[0].outputs


def completion(client, stream=False, **options):
    """(choices sorted by index as (index, text, token_ids, finish_reason, stop_reason),
    the streamed text pieces of each choice)."""
    body = dict(model="tiny", prompt=options.pop("prompt", PROMPT), stream=stream)
    extra = {"return_token_ids": True} | options.pop("extra_body", {})
    result = client.completions.create(**body, **options, extra_body=extra)
    if not stream:
        return [
            (c.index, c.text, c.token_ids, c.finish_reason, getattr(c, "stop_reason", None))
            for c in sorted(result.choices, key=lambda c: c.index)
        ], None
    pieces: dict[int, list[str]] = {}
    ids: dict[int, list[int]] = {}
    ends: dict[int, tuple] = {}
    for chunk in result:
        for c in chunk.choices:
            pieces.setdefault(c.index, []).append(c.text)
            ids.setdefault(c.index, []).extend(getattr(c, "token_ids", None) or [])
            if c.finish_reason is not None:
                assert c.index not in ends, "a choice finished twice"
                ends[c.index] = (c.finish_reason, getattr(c, "stop_reason", None))
    choices = [(i, "".join(pieces[i]), ids[i], *ends[i]) for i in sorted(pieces)]
    return choices, pieces


OPTIONS = [
    dict(temperature=0, presence_penalty=1.5),
    dict(temperature=0, frequency_penalty=1.0),
    dict(temperature=0, repetition_penalty=1.8),
    dict(temperature=0.9, min_p=0.2, seed=3),
    dict(temperature=0, logit_bias={7: 8.0, 9: -100.0}),
    dict(temperature=0.8, seed=11, top_p=0.7, top_k=20),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(sorted(o)))
def test_sampling_options_give_the_offline_tokens(server, offline, options, stream):
    srv, _ = server
    wire = dict(options)
    if "logit_bias" in wire:  # JSON keys are strings
        wire["logit_bias"] = {str(k): v for k, v in wire["logit_bias"].items()}
    extra = {k: wire.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in wire}
    got, _ = completion(client_for(srv), stream, max_tokens=14, extra_body=extra, **wire)
    (want,) = offline_outputs(offline, PROMPT, max_tokens=14, **options)
    assert got == [(0, want.text, want.token_ids, want.finish_reason, None)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_min_tokens_and_stop_token_ids(server, offline, stream):
    srv, _ = server
    (free,) = offline_outputs(offline, PROMPT, temperature=0, max_tokens=12)
    stop_id = free.token_ids[4]  # a token the greedy answer reaches at place 4
    for min_tokens in (0, 7):
        extra = dict(stop_token_ids=[stop_id], min_tokens=min_tokens)
        (want,) = offline_outputs(offline, PROMPT, temperature=0, max_tokens=12, **extra)
        got, _ = completion(client_for(srv), stream, temperature=0, max_tokens=12, extra_body=extra)
        assert got == [(0, want.text, want.token_ids, want.finish_reason, want.stop_reason)]
        if min_tokens == 0:  # ended by the stop token, which is its stop_reason
            assert (want.token_ids[-1], want.stop_reason) == (stop_id, stop_id)
        else:  # EOS and the stop token are banned for the first 7 tokens
            assert len(want.token_ids) >= 7


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_n_choices_are_numbered_as_openai_and_equal_the_offline_ones(server, offline, stream):
    srv, _ = server
    prompts = [PROMPT, "prompt 2: xyz"]
    got, _ = completion(
        client_for(srv), stream, prompt=prompts, n=3, temperature=0.9, seed=5, max_tokens=8
    )
    outs = offline.generate(
        prompts, SamplingParams(n=3, temperature=0.9, seed=5, max_tokens=8), use_tqdm=False
    )
    want = [
        (i * 3 + j, c.text, c.token_ids, c.finish_reason, None)
        for i, out in enumerate(outs)
        for j, c in enumerate(out.outputs)
    ]
    assert got == want
    assert len({tuple(g[2]) for g in got[:3]}) > 1, "the n choices of a prompt should differ"


def stop_string_of(offline) -> tuple[str, str]:
    """A stop string that appears in the middle of the greedy answer (and the answer)."""
    (free,) = offline_outputs(offline, PROMPT, temperature=0, max_tokens=40)
    text = free.text
    middle = len(text) // 2
    stop = text[middle : middle + 3]
    assert len(stop) == 3 and stop.strip(), f"no usable stop string in {text!r}"
    return stop, text


@pytest.mark.parametrize("include", [False, True], ids=["cut", "kept"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_strings_cut_the_text_and_end_the_request(server, offline, stream, include):
    srv, async_llm = server
    stop, text = stop_string_of(offline)
    at = text.find(stop)
    expected = text[: at + len(stop)] if include else text[:at]
    extra = {"include_stop_str_in_output": include}
    got, pieces = completion(
        client_for(srv), stream, temperature=0, max_tokens=40, stop=[stop, "\x00never"],
        extra_body=extra,
    )  # fmt: skip
    ((index, answer, _, reason, stop_reason),) = got
    assert (answer, reason, stop_reason) == (expected, "stop", stop)
    options = dict(temperature=0, max_tokens=40, stop=[stop], include_stop_str_in_output=include)
    (want,) = offline_outputs(offline, PROMPT, **options)
    assert (want.text, want.finish_reason, want.stop_reason) == (expected, "stop", stop)
    if stream:
        # Never sent and then taken back: the pieces add up to the answer, and no piece
        # before the last holds the start of the stop string beyond what the answer has.
        assert "".join(pieces[0]) == expected
    wait_until(lambda: engine_idle_and_free(async_llm), what="the engine freeing the request")


def test_a_stream_holds_back_a_partial_stop_string():
    """Unit: the characters that could be the start of a stop string are not sent until
    what follows shows they are not; a stop string spread over three deltas ends the
    choice, and what was sent is exactly the text before it."""

    class Chars:  # a tokenizer whose token i is chr(i)
        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    choice = ChoiceState(
        0, [1], IncrementalDetokenizer(Chars()), SamplingParams(stop=["STOP"], max_tokens=99)
    )

    def push(part: str) -> str:
        return choice.push(RequestOutputDelta("r-0", [ord(c) for c in part]))

    # The last three characters (a stop string of four, less one) wait for what follows.
    assert [push(part) for part in ("abS", "T", "x", "yS", "TO")] == ["", "a", "b", "ST", "xy"]
    assert push("Pz") == "" and choice.text == "abSTxy"
    assert (choice.finish_reason, choice.stop_reason) == ("stop", "STOP")
    assert choice.push(RequestOutputDelta("r-0", [ord("q")], "length")) == ""  # ended already


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_logprobs_equal_the_offline_ones(server, offline, stream):
    srv, _ = server
    client = client_for(srv)
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, stream=stream
    )
    chunks = list(result) if stream else [result]
    tokens, logprobs, tops, offsets, text = [], [], [], [], ""
    for chunk in chunks:
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
                logprobs += c.logprobs.token_logprobs
                tops += c.logprobs.top_logprobs
                offsets += c.logprobs.text_offset
    (want,) = offline_outputs(offline, PROMPT, max_tokens=6, temperature=0, logprobs=3)
    assert len(tokens) == len(want.token_ids) == 6
    for place, (token_id, lp, top) in enumerate(zip(want.token_ids, logprobs, tops)):
        assert math.isclose(lp, want.logprobs[place][token_id].logprob, rel_tol=1e-5, abs_tol=1e-6)
        # The 3 most likely and the token itself, keyed by their text: two tokens that
        # decode alike (pieces of one character, U+FFFD) share a key, as in OpenAI's form.
        offline_values = [entry.logprob for entry in want.logprobs[place].values()]
        assert 1 <= len(top) <= 4
        for value in top.values():
            assert any(math.isclose(value, w, abs_tol=1e-6) for w in offline_values)
        assert max(top.values()) == pytest.approx(max(offline_values))
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert "".join(tokens) == text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_logprobs_have_openais_shape(server, offline, stream):
    srv, _ = server
    client = client_for(srv)
    messages = [{"role": "user", "content": "hi there"}]
    result = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=stream,
    )
    if stream:
        content = [
            e for chunk in result for c in chunk.choices if c.logprobs for e in c.logprobs.content
        ]
    else:
        content = result.choices[0].logprobs.content
    (want,) = offline.chat(
        messages,
        SamplingParams(max_tokens=5, temperature=0, logprobs=2),
        chat_template=CHAT_TEMPLATE,
        use_tqdm=False,
    )[0].outputs
    assert len(content) == len(want.token_ids) == 5
    for place, (entry, token_id) in enumerate(zip(content, want.token_ids)):
        assert entry.logprob == pytest.approx(want.logprobs[place][token_id].logprob, abs=1e-6)
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_echo_puts_the_prompt_before_the_answer(server, offline, stream):
    srv, _ = server
    got, pieces = completion(client_for(srv), stream, temperature=0, max_tokens=6, echo=True)
    ((_, text, ids, reason, _),) = got
    (want,) = offline_outputs(offline, PROMPT, temperature=0, max_tokens=6)
    assert (text, ids, reason) == (PROMPT + want.text, want.token_ids, want.finish_reason)
    if stream:
        assert pieces[0][0] == PROMPT  # the first chunk is the prompt, alone


def test_logprobs_from_an_async_scheduling_server(offline):
    """Under async scheduling the log-probabilities come a step later, with the tokens."""
    engine = dict(ENGINE, async_scheduling=True)
    with serving(lambda: LLM("tiny", **engine)) as (srv, _):
        result = client_for(srv).completions.create(
            model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1
        )
    (want,) = offline_outputs(offline, PROMPT, max_tokens=6, temperature=0, logprobs=1)
    got = result.choices[0].logprobs.token_logprobs
    assert got == pytest.approx([e[t].logprob for t, e in zip(want.token_ids, want.logprobs)])


def test_prompt_logprobs_and_echo_with_logprobs(server, offline):
    """vLLM's prompt_logprobs, and echo with logprobs: the prompt's tokens first, each with
    the log-probability the offline engine gives it (None for the first)."""
    srv, _ = server
    client = client_for(srv)
    params = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2)
    (want,) = offline.generate([PROMPT], params, use_tqdm=False)
    prompt_ids = want.prompt_token_ids
    assert want.prompt_logprobs[0] is None and len(want.prompt_logprobs) == len(prompt_ids)
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0,
        extra_body={"prompt_logprobs": 2},
    )  # fmt: skip
    got = result.choices[0].prompt_logprobs
    assert got[0] is None and len(got) == len(prompt_ids)
    for place in range(1, len(prompt_ids)):
        token = prompt_ids[place]
        assert got[place][str(token)]["logprob"] == pytest.approx(
            want.prompt_logprobs[place][token].logprob, abs=1e-6
        )
        assert len(got[place]) in (2, 3)  # the 2 most likely, and the token if not among them
    for stream in (False, True):
        answer = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=1,
            stream=stream,
        )  # fmt: skip
        chunks = list(answer) if stream else [answer]
        logprobs = [c.logprobs for chunk in chunks for c in chunk.choices if c.logprobs]
        tokens = [t for lp in logprobs for t in lp.tokens]
        values = [v for lp in logprobs for v in lp.token_logprobs]
        offsets = [o for lp in logprobs for o in lp.text_offset]
        assert len(tokens) == len(prompt_ids) + 4
        assert values[0] is None
        for place in range(1, len(prompt_ids)):
            assert values[place] == pytest.approx(
                want.prompt_logprobs[place][prompt_ids[place]].logprob, abs=1e-6
            )
        assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
