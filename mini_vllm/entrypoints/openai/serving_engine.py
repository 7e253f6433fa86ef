"""What the completion and chat handlers share: checks, sampling, streaming, errors.

vLLM counterpart: vllm/entrypoints/openai/engine/serving.py (`OpenAIServing`:
`_check_model`, `create_error_response`, `create_streaming_error_response`; the prompt-length
check of `_validate_input`) and vllm/entrypoints/utils.py (`with_cancellation`, which aborts
a non-streaming request whose client went away); vllm/utils/async_utils.py
(`merge_async_iterators`, one stream out of several requests).

Every check runs before the request reaches the engine, so that a bad request is answered at
once with an OpenAI-style error (`{"error": {"message", "type", "param", "code"}}`) and never
disturbs the requests being served: 404 for a model this server does not serve, 400 for a
value the engine cannot take (max_tokens < 1, a negative temperature, a prompt longer than
the context, text that is not valid Unicode, a feature not served yet), 503 while the engine
warms up. An error message quotes what the client sent only in part (`clip`).

Work that grows with the request's size (tokenizing, rendering the chat template, checking
each token id) runs in a worker thread (`asyncio.to_thread`; vLLM's `AsyncMicrobatchTokenizer`
of vllm/utils/async_utils.py keeps its tokenizer off the event loop too), so that one large
prompt never stalls `/health` or the streams of others. The prompt's length is checked first,
from what costs nothing to count (the ids of a token-id prompt, the characters of a text one),
so that a prompt far longer than the context is refused before any work per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mini_vllm.engine.core import EngineInfo
from mini_vllm.engine.llm_engine import check_prompt_ids
from mini_vllm.entrypoints.async_llm import AsyncLLM, RequestOutputDelta
from mini_vllm.entrypoints.openai.protocol import (
    ErrorInfo,
    ErrorResponse,
    UsageInfo,
    clip,
    random_id,
)
from mini_vllm.errors import UserError
from mini_vllm.llm import sampling_children
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import IncrementalDetokenizer

__all__ = [
    "ERROR_TYPES",
    "ChoiceState",
    "token_text",
    "OpenAIServing",
    "ServingError",
    "error_body",
    "merge_async_iterators",
    "run_until_disconnected",
    "sse",
]

# Bounds on one request's engine requests: n (OpenAI's) and prompts times n, so that one
# request cannot fill the waiting queue with thousands of sequences.
MAX_N = 128
MAX_CHOICES = 1024

# Request fields passed to SamplingParams under the same name when set.
SAMPLING_FIELDS = (
    "top_p",
    "top_k",
    "seed",
    "n",
    "stop",
    "stop_token_ids",
    "include_stop_str_in_output",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
)

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
# An error message longer than this is cut: messages quote the request only in part (`clip`),
# this bounds what a template's or a library's own message may add.
MAX_ERROR_MESSAGE = 2000


class ServingError(Exception):
    """A request the server refuses: the message says what to send instead."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status_code, self.param = message, status_code, param


def _printable(text: str) -> str:
    # A lone surrogate (JSON's "\\ud800") cannot be encoded as UTF-8: the JSON answer that
    # quotes it would fail as a 500. Show it escaped instead.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(message: str, status_code: int, param: str | None = None) -> dict[str, Any]:
    error_type = ERROR_TYPES.get(status_code, HTTPStatus(status_code).phrase.replace(" ", ""))
    if len(message) > MAX_ERROR_MESSAGE:
        message = f"{message[:MAX_ERROR_MESSAGE]}... ({len(message)} characters in all)"
    message = _printable(message)
    param = None if param is None else _printable(param[:200])
    info = ErrorInfo(message=message, type=error_type, param=param, code=status_code)
    return ErrorResponse(error=info).model_dump()


def check_unicode(text: str, param: str) -> None:
    """A 400 naming `param` if `text` holds what UTF-8 cannot encode (a lone surrogate, which
    JSON's `\\ud800` escapes can carry): the tokenizer would fail on it as a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ServingError(
            f"{param} is not valid Unicode: character {exc.start} is {text[exc.start]!r}, a lone "
            "surrogate (half of a UTF-16 pair), which UTF-8 cannot encode: send both halves of "
            "the pair, or valid UTF-8 text",
            400,
            param,
        ) from None


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def dump(model: Any) -> dict[str, Any]:
    """A response as JSON-ready dict, without the optional fields left unset (the token ids
    when not asked for, the delta's absent role or content, a chunk's usage)."""
    data = model.model_dump(mode="json")
    if data.get("usage", 0) is None:
        del data["usage"]
    for choice in data.get("choices", []):
        if choice.get("token_ids", 0) is None:
            del choice["token_ids"]
        if "delta" in choice:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    return data


@dataclass
class ChoiceState:
    """One choice (one engine request) on its way: its tokens, its text, how it ended.

    Stop strings are looked for here, in the text as it is decoded, as vLLM's detokenizer
    does (`check_stop_strings`, vllm/v1/engine/detokenizer.py): the text is cut where one
    appears (after it with `include_stop_str_in_output`) and the choice ends with "stop".
    While the choice goes on, the last characters that could be the start of a stop string
    are held back, so that a streamed answer never sends text it would have to take back.
    """

    index: int
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple | None] = field(default_factory=list)  # one entry a token
    prompt_logprobs: list[tuple | None] | None = None  # one entry a prompt token
    text: str = ""  # decoded so far, cut at a stop string once one is found
    finish_reason: str | None = None
    # What ended a "stop": the stop string, or the stop token's id (None: EOS), as vLLM's.
    stop_reason: str | int | None = None
    sent: int = 0  # characters of `text` that push() has returned

    @property
    def stop(self) -> tuple[str, ...]:
        return self.params.stop

    @property
    def holdback(self) -> int:
        """Characters kept back while the choice goes on: a stop string's start may be there."""
        if not self.stop or self.params.include_stop_str_in_output:
            return 0  # an unfinished stop string would be sent anyway with include_stop_str
        return max(len(stop) for stop in self.stop) - 1

    # ANCHOR: choice_push
    def push(self, delta: RequestOutputDelta) -> str:
        """Take a delta in; return the text it lets go out (all that is left at the end).
        A choice that a stop string ended takes nothing more."""
        if self.finish_reason is not None:
            return ""
        decoded = "".join(self.detokenizer.push(t) for t in delta.new_token_ids)
        self.token_ids += delta.new_token_ids
        if delta.logprobs is not None:
            self.logprobs += delta.logprobs
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.finish_reason is not None:
            decoded += self.detokenizer.flush()
        before = len(self.text)
        self.text += decoded
        if self.stop:
            self._cut_at_stop_string(before)
        if self.finish_reason is None:
            self.finish_reason = delta.finish_reason
            last = self.token_ids[-1] if self.token_ids else None
            if delta.finish_reason == "stop" and last in self.params.stop_token_ids:
                if self.params.ignore_eos or last not in self.eos_token_ids:
                    self.stop_reason = last  # a stop token, not EOS (which has none)
        end = len(self.text)
        if self.finish_reason is None:
            end = max(self.sent, end - self.holdback)
        out, self.sent = self.text[self.sent : end], end
        return out

    def _cut_at_stop_string(self, before: int) -> None:
        # Only the new text, and the characters before it a stop string could begin in.
        window = max(0, before - max(len(stop) for stop in self.stop) + 1)
        found = [(self.text.find(stop, window), stop) for stop in self.stop]
        found = [(at, stop) for at, stop in found if at >= 0]
        if not found:
            return
        at, stop = min(found)
        keep = self.params.include_stop_str_in_output
        self.text = self.text[: at + len(stop) if keep else at]
        self.finish_reason, self.stop_reason = "stop", stop

    # ANCHOR_END: choice_push


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token as text, for logprobs (a piece of a multi-byte character shows as U+FFFD)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


async def merge_async_iterators(
    iterators: list[AsyncIterator[Any]],
) -> AsyncIterator[tuple[int, Any]]:
    """(index, item) from every iterator as items come. Leaving early (or being cancelled)
    closes every iterator, which aborts their requests."""
    items: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(index: int, iterator: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(iterator):
                async for item in iterator:
                    items.put_nowait((index, item))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the consumer, raised there
            items.put_nowait((index, exc))
        finally:
            items.put_nowait((index, end))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await items.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ANCHOR: run_until_disconnected
async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnected(work: Awaitable[Any], request: Request) -> tuple[bool, Any]:
    """Run `work` unless the client goes away first, in which case it is cancelled (which
    aborts its requests). Returns (finished, its result)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # the client left first (or this handler was cancelled)
        # Let both finish: the work's cancellation runs its `finally`, which aborts.
        await asyncio.gather(watcher, task, return_exceptions=True)
    if task.cancelled():
        return False, None
    return True, task.result()


# ANCHOR_END: run_until_disconnected


class OpenAIServing:
    """The checks and the engine calls both endpoints make."""

    def __init__(self, async_llm: AsyncLLM, served_model_name: str) -> None:
        self.async_llm = async_llm
        self.served_model_name = served_model_name
        self._max_chars_per_token: int | None = None  # of the tokenizer, once asked for

    @property
    def engine(self) -> EngineInfo:
        """What the server knows of the engine, or a 503 while it warms up (or if it failed
        to start, or stopped)."""
        info = self.async_llm.info
        if info is None or not self.async_llm.is_ready:
            why = self.async_llm.startup_error
            if why is not None:
                raise ServingError(f"the engine failed to start: {why}", 503)
            why = self.async_llm.engine_error
            if why is not None:
                raise ServingError(f"the engine stopped: {why}; restart the server", 503)
            raise ServingError(
                "the model is still loading and warming up (compiling, capturing CUDA graphs); "
                "retry when GET /health answers 200",
                503,
            )
        return info

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def check_request(self, request: Any) -> None:
        _ = self.engine  # 503 before the warm-up is done
        if request.model is not None and request.model != self.served_model_name:
            raise ServingError(
                f"The model {clip(request.model)} does not exist: this server serves "
                f"`{self.served_model_name}` (GET /v1/models lists it; or leave `model` out)",
                404,
                "model",
            )
        choices = getattr(request, "num_prompts", 1) * (request.n or 1)
        if request.n is not None and request.n > MAX_N:
            raise ServingError(
                f"n is {request.n}: at most {MAX_N} choices a prompt (OpenAI's bound); send "
                "several requests for more",
                400,
                "n",
            )
        if choices > MAX_CHOICES:
            raise ServingError(
                f"this request asks for {choices} choices (prompts times n), more than "
                f"{MAX_CHOICES} in one request: split it into several requests",
                400,
                "prompt" if request.n in (None, 1) else "n",
            )
        unsupported = request.unsupported_fields()
        if unsupported:
            names = ", ".join(unsupported)
            neutral = [(name, request.neutral_value(name)) for name in unsupported]
            instead = "; ".join(
                f"leave {name} out"
                if value is None
                else f"leave {name} out or send {json.dumps(value)}"
                for name, value in neutral
            )
            raise ServingError(
                f"mini_vllm's server does not support {names} yet: {instead}"
                + (" (send the request n times instead)" if "n" in unsupported else ""),
                400,
                unsupported[0],
            )

    def max_chars_per_token(self) -> int:
        """The most characters of text one token of this tokenizer can stand for, plus one (a
        decoder may drop a word's leading space): a prompt of more than this many characters
        per token of context cannot fit. Assumes the tokenizer's normalizer drops no text,
        which holds for the byte-level BPE and SentencePiece tokenizers of LLMs."""
        if self._max_chars_per_token is None:
            engine = self.engine
            decode = engine.tokenizer.decode
            longest = 1
            for token in range(engine.vocab_size):
                try:
                    longest = max(longest, len(decode([token], skip_special_tokens=False)))
                except Exception:  # an id the tokenizer lacks (a padded vocabulary) is no text
                    continue
            self._max_chars_per_token = longest + 1
        return self._max_chars_per_token

    def check_text_length(self, text: str, param: str) -> None:
        """Refuse a text far longer than the context before tokenizing it (the tokenizer holds
        the GIL while it works: a 10 MiB prompt would stall every thread for seconds)."""
        limit = self.max_model_len * self.max_chars_per_token()
        if len(text) > limit:
            what = "the prompt" if param == "prompt" else f"{param}, rendered as text,"
            raise ServingError(
                f"This model's maximum context length is {self.max_model_len} tokens, and "
                f"{what} has {len(text)} characters, more than {limit} (the most that "
                f"{self.max_model_len} tokens of this tokenizer can spell out): shorten it",
                400,
                param,
            )

    def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """Text to ids, checked first for length and Unicode. Call off the event loop."""
        self.check_text_length(text, param)
        check_unicode(text, param)
        return self.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def check_prompt(self, ids: list[int], param: str) -> list[int]:
        """The prompt's ids, checked against the context length (first: it costs nothing) and
        the vocabulary. Call off the event loop: the second check visits every id."""
        if len(ids) >= self.max_model_len:
            raise ServingError(
                f"This model's maximum context length is {self.max_model_len} tokens, and the "
                f"prompt has {len(ids)} tokens, which leaves no room for a new token: shorten "
                "the prompt",
                400,
                param,
            )
        try:
            return check_prompt_ids(ids, self.engine.vocab_size)
        except UserError as exc:
            raise ServingError(str(exc), 400, param) from None

    def sampling_params(
        self,
        request: Any,
        prompt_len: int,
        max_tokens: int | None,
        max_tokens_param: str = "max_tokens",
    ) -> SamplingParams:
        """SamplingParams from the request; `max_tokens` None: the rest of the context.
        `max_tokens_param` names the field it came from (chat has two)."""
        if max_tokens is None:
            max_tokens = self.max_model_len - prompt_len
        elif max_tokens < 1:
            raise ServingError(
                f"{max_tokens_param} must be at least 1 (the most tokens to generate; vLLM's "
                f"rule too), got {max_tokens}: leave it out for the default",
                400,
                max_tokens_param,
            )
        else:
            total = prompt_len + max_tokens
            if total > self.max_model_len:
                raise ServingError(
                    f"This model's maximum context length is {self.max_model_len} tokens; the "
                    f"prompt has {prompt_len} and {max_tokens_param} asks for {max_tokens} more "
                    f"({total} in all): lower {max_tokens_param} to at most "
                    f"{self.max_model_len - prompt_len}, or shorten the prompt",
                    400,
                    max_tokens_param,
                )
        options = dict(max_tokens=max_tokens, ignore_eos=request.ignore_eos)
        options["temperature"] = 1.0 if request.temperature is None else request.temperature
        for name in SAMPLING_FIELDS:
            if getattr(request, name) is not None:
                options[name] = getattr(request, name)
        if request.logit_bias is not None:
            options["logit_bias"] = self._logit_bias(request.logit_bias)
        logprobs = self.requested_logprobs(request)
        if logprobs is not None:
            options["logprobs"] = logprobs
        prompt_logprobs = self.requested_prompt_logprobs(request)
        if prompt_logprobs is not None:
            options["prompt_logprobs"] = prompt_logprobs
        try:
            params = SamplingParams(**options)
        except UserError as exc:
            # SamplingParams' messages start with the field's name.
            raise ServingError(str(exc), 400, str(exc).split()[0]) from None
        engine = self.engine
        needed = engine.blocks_needed(prompt_len + params.max_tokens)
        if needed > engine.num_kv_blocks:
            raise ServingError(
                f"the prompt ({prompt_len} tokens) and {max_tokens_param} ({params.max_tokens}) "
                f"need {needed} KV blocks, more than the whole cache of {engine.num_kv_blocks}: "
                f"lower {max_tokens_param} (or start the server with a larger cache)",
                400,
                max_tokens_param,
            )
        return params

    def requested_logprobs(self, request: Any) -> int | None:
        """SamplingParams.logprobs for the request (None: no log-probabilities)."""
        return None  # each endpoint has its own fields for them

    def requested_prompt_logprobs(self, request: Any) -> int | None:
        """SamplingParams.prompt_logprobs for the request (None: none)."""
        return None

    def _logit_bias(self, bias: dict[str, float]) -> dict[int, float]:
        """OpenAI's logit_bias (token ids as strings, biases in [-100, 100]) as the engine's."""
        vocab = self.engine.vocab_size
        out = {}
        for key, value in bias.items():
            if not (key.isdigit() and int(key) < vocab):
                raise ServingError(
                    f"logit_bias has the key {clip(key)}: each key must be a token id of this "
                    f"model, an integer from 0 to {vocab - 1} written as a string",
                    400,
                    "logit_bias",
                )
            if not -100 <= value <= 100:
                raise ServingError(
                    f"logit_bias[{clip(key)}] is {value}: a bias must be in [-100, 100] "
                    "(OpenAI's range)",
                    400,
                    "logit_bias",
                )
            out[int(key)] = value
        return out

    def start(
        self, request_id: str, prompts: list[list[int]], params: list[SamplingParams]
    ) -> tuple[list[ChoiceState], AsyncIterator[tuple[int, RequestOutputDelta]]]:
        """Send every prompt to the engine, `n` requests each (choice i * n + j is the j-th
        of prompt i, as OpenAI numbers them; a seeded one gets seed + j, as `LLM.generate`
        and vLLM's parallel sampling); the choices to fill, and the deltas as they come."""
        arrival = time.monotonic()
        tokenizer = self.engine.tokenizer
        eos = self.engine.eos_token_ids
        choices, streams = [], []
        for ids, sp in zip(prompts, params):
            for child in sampling_children(sp):
                index = len(choices)
                detokenizer = IncrementalDetokenizer(tokenizer)
                choices.append(ChoiceState(index, ids, detokenizer, child, eos))
                streams.append(
                    self.async_llm.generate(f"{request_id}-{index}", ids, child, arrival)
                )
        return choices, merge_async_iterators(streams)

    async def respond(
        self,
        request: Any,
        raw_request: Request,
        id_prefix: str,
        prompts: list[list[int]],
        params: list[SamplingParams],
    ) -> Response:
        """Start one engine request a prompt, then answer: a stream of server-sent events
        (`self.stream_events`) or, once every choice has finished, one JSON body
        (`self.whole_response`); 499 if the client went away before that."""
        request_id = random_id(id_prefix)
        choices, deltas = self.start(request_id, prompts, params)
        if request.stream:
            events = self.stream_events(request, request_id, choices, deltas)
            return StreamingResponse(events, media_type="text/event-stream")
        if not await self.collect_while_connected(request_id, choices, deltas, raw_request):
            return Response(status_code=499)  # the client is gone; nobody reads this
        return JSONResponse(dump(self.whole_response(request, request_id, choices)))

    def stream_events(self, request, request_id, choices, deltas) -> AsyncIterator[str]:
        """The server-sent events of a streamed answer (each endpoint has its chunks)."""
        raise NotImplementedError

    def whole_response(self, request, request_id, choices) -> Any:
        """The body of an answer given whole, once every choice has finished."""
        raise NotImplementedError

    @staticmethod
    def usage(choices: list[ChoiceState]) -> UsageInfo:
        prompt = sum(len(c.prompt_token_ids) for c in choices)
        completion = sum(len(c.token_ids) for c in choices)
        return UsageInfo(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )

    def take(self, request_id: str, choice: ChoiceState, delta: RequestOutputDelta) -> str | None:
        """`choice.push(delta)`; None when the choice had already ended (a stop string in its
        text ended it before the engine did). When this delta's text reached a stop string,
        the engine is told to end the request."""
        if choice.finish_reason is not None:
            return None
        text = choice.push(delta)
        if choice.stop_reason is not None and delta.finish_reason is None:
            self.async_llm.finish(f"{request_id}-{choice.index}")
        return text

    async def collect(
        self,
        request_id: str,
        choices: list[ChoiceState],
        deltas: AsyncIterator[tuple[int, RequestOutputDelta]],
    ) -> ServingError | None:
        """Run every choice to its end; the first error, if one ended with an error."""
        async with contextlib.aclosing(deltas):
            async for index, delta in deltas:
                if delta.finish_reason == "error":
                    return ServingError(delta.error or "the request failed", delta.status_code)
                self.take(request_id, choices[index], delta)
        return None

    async def collect_while_connected(
        self,
        request_id: str,
        choices: list[ChoiceState],
        deltas: AsyncIterator[tuple[int, RequestOutputDelta]],
        raw_request: Request,
    ) -> bool:
        """`collect`, cancelled if the client goes away first: False then. A request that
        ended with an error raises it (the handler turns it into an error response)."""
        work = self.collect(request_id, choices, deltas)
        finished, error = await run_until_disconnected(work, raw_request)
        if finished and error is not None:
            raise error
        return finished

    @staticmethod
    def stream_error(delta: RequestOutputDelta) -> str:
        """The event that ends a stream that failed after its 200 was sent."""
        body = error_body(delta.error or "the request failed", delta.status_code)
        return sse(body) + sse("[DONE]")
