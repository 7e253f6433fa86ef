"""`POST /v1/completions`: text (or token ids) in, a completion out, whole or streamed.

vLLM counterpart: vllm/entrypoints/openai/completion/serving.py (`OpenAIServingCompletion`:
`create_completion`, `completion_stream_generator`, `request_output_to_completion_response`).

A prompt is a string, a list of token ids, or a batch of either: each prompt of a batch is `n`
engine requests and `n` choices (`index` = i * n + j for the j-th of prompt i, OpenAI's
numbering). With `logprobs` each choice carries OpenAI's legacy logprobs object (tokens,
their log-probabilities, the most likely alternatives, text offsets). With `"stream": true` the
answer is server-sent events, one chunk per step that gave the choice tokens, the last one
with its `finish_reason`; then, with `stream_options.include_usage`, a chunk with no choices
and the usage; then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from mini_vllm.entrypoints.async_llm import RequestOutputDelta
from mini_vllm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    PromptLogprob,
)
from mini_vllm.entrypoints.openai.serving_engine import (
    ChoiceState,
    OpenAIServing,
    ServingError,
    dump,
    sse,
    token_text,
)
from mini_vllm.outputs import logprob_entry

__all__ = ["OpenAIServingCompletion"]


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Response:
        self.check_request(request)
        # Tokenizing and checking every id grow with the prompt: off the event loop.
        prompts = await asyncio.to_thread(self._prompt_ids, request.prompt)
        params = [self.sampling_params(request, len(ids), request.max_tokens) for ids in prompts]
        return await self.respond(request, raw_request, "cmpl", prompts, params)

    def requested_logprobs(self, request: CompletionRequest) -> int | None:
        return request.logprobs

    def requested_prompt_logprobs(self, request: CompletionRequest) -> int | None:
        if request.echo and request.logprobs is not None:  # the echoed tokens carry them
            return max(request.logprobs, request.prompt_logprobs or 0)
        return request.prompt_logprobs

    def whole_response(self, request, request_id, choices) -> CompletionResponse:
        return CompletionResponse(
            id=request_id,
            model=self.served_model_name,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=self._echo(request, c) + c.text,
                    logprobs=self._whole_logprobs(request, c),
                    prompt_logprobs=self._prompt_logprobs(request, c),
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=c.token_ids if request.return_token_ids else None,
                )
                for c in choices
            ],
            usage=self.usage(choices),
        )

    def _whole_logprobs(self, request, choice: ChoiceState) -> CompletionLogProbs | None:
        """The choice's logprobs; with echo, the prompt's tokens first."""
        if request.logprobs is None:
            return None
        if not request.echo:
            return self._logprobs(request, choice.token_ids, choice.logprobs, 0)
        echoed = self._echoed_logprobs(request, choice)
        after_prompt = sum(map(len, echoed.tokens))
        answer = self._logprobs(request, choice.token_ids, choice.logprobs, after_prompt)
        for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
            getattr(echoed, name).extend(getattr(answer, name))
        return echoed

    def _echoed_logprobs(self, request, choice: ChoiceState) -> CompletionLogProbs:
        """The prompt's tokens as logprobs (the first has none: nothing predicts it)."""
        entries = choice.prompt_logprobs or [None] * len(choice.prompt_token_ids)
        echoed = self._logprobs(request, choice.prompt_token_ids, entries, 0)
        echoed.top_logprobs[0] = None  # OpenAI's form for the first prompt token
        return echoed

    def _prompt_logprobs(self, request, choice: ChoiceState) -> list | None:
        """vLLM's prompt_logprobs: {token id: logprob, rank, text} a prompt token."""
        if request.prompt_logprobs is None or choice.prompt_logprobs is None:
            return None
        tokenizer = self.engine.tokenizer
        out: list[dict[int, PromptLogprob] | None] = []
        for kept in choice.prompt_logprobs:
            if kept is None:
                out.append(None)
                continue
            entry = logprob_entry(kept, lambda token: token_text(tokenizer, token))
            out.append(
                {
                    token: PromptLogprob(
                        logprob=v.logprob, rank=v.rank, decoded_token=v.decoded_token
                    )
                    for token, v in entry.items()
                }
            )
        return out

    def _echo(self, request: CompletionRequest, choice: ChoiceState) -> str:
        """With echo, the prompt as text (a token-id prompt decoded), put before the answer."""
        if not request.echo:
            return ""
        return self.engine.tokenizer.decode(choice.prompt_token_ids, skip_special_tokens=False)

    def _logprobs(
        self, request: CompletionRequest, token_ids: list[int], entries: list, offset: int
    ) -> CompletionLogProbs | None:
        """OpenAI's completions logprobs for these tokens; `offset`: where the first one's text
        starts in the choice's text. Each token's top_logprobs holds the token itself beside
        its `logprobs` most likely alternatives, as vLLM's."""
        if request.logprobs is None:
            return None
        tokenizer = self.engine.tokenizer
        out = CompletionLogProbs()
        for token, entry in zip(token_ids, entries):
            text = token_text(tokenizer, token)
            logprob = None if entry is None else entry[1]
            top: dict[str, float] = {}
            # Most likely first: of two tokens that decode alike (pieces of one character)
            # the key keeps the likelier one's log-probability.
            for alternative, value in [] if entry is None else entry[3]:
                top.setdefault(token_text(tokenizer, alternative), value)
            if logprob is not None:
                top.setdefault(text, logprob)
            out.tokens.append(text)
            out.token_logprobs.append(logprob)
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def _prompt_ids(self, prompt: str | list) -> list[list[int]]:
        """Every prompt of the request as checked token ids (text is encoded as `LLM.generate`
        does). Runs in a worker thread."""
        if isinstance(prompt, str):
            prompts = [self._encode(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self._encode(p) for p in prompt]
        elif prompt and all(isinstance(p, list) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            prompts = [list(prompt)]  # token ids (an empty list is refused as an empty prompt)
        return [self.check_prompt(ids, "prompt") for ids in prompts]

    def _encode(self, text: str) -> list[int]:
        if not text:
            raise ServingError("the prompt is empty: give at least one character", 400, "prompt")
        return self.encode(text, "prompt")

    async def stream_events(
        self,
        request: CompletionRequest,
        request_id: str,
        choices: list[ChoiceState],
        deltas: AsyncIterator[tuple[int, RequestOutputDelta]],
    ) -> AsyncIterator[str]:
        offsets = [0] * len(choices)  # where each choice's next token text starts
        echoed = [not request.echo] * len(choices)
        async with contextlib.aclosing(deltas):
            async for index, delta in deltas:
                if delta.finish_reason == "error":
                    yield self.stream_error(delta)
                    return
                choice = choices[index]
                text = self.take(request_id, choice, delta)
                if text is None:  # ended by a stop string already
                    continue
                if not echoed[index]:  # the choice's first chunk is its prompt
                    echoed[index] = True
                    first = CompletionChoice(index=index, text=self._echo(request, choice))
                    if request.logprobs is not None:
                        first.logprobs = self._echoed_logprobs(request, choice)
                        offsets[index] = sum(map(len, first.logprobs.tokens))
                    chunk = CompletionStreamResponse(
                        id=request_id, model=self.served_model_name, choices=[first]
                    )
                    yield sse(dump(chunk))
                logprobs = self._logprobs(
                    request, delta.new_token_ids, delta.logprobs or [], offsets[index]
                )
                if logprobs is not None:
                    offsets[index] += sum(len(t) for t in logprobs.tokens)
                chunk = CompletionStreamResponse(
                    id=request_id,
                    model=self.served_model_name,
                    choices=[
                        CompletionChoice(
                            index=index,
                            text=text,
                            logprobs=logprobs,
                            prompt_logprobs=self._prompt_logprobs(request, choice)
                            if delta.prompt_logprobs is not None
                            else None,
                            finish_reason=choice.finish_reason,
                            stop_reason=choice.stop_reason,
                            token_ids=delta.new_token_ids if request.return_token_ids else None,
                        )
                    ],
                )
                yield sse(dump(chunk))
        if request.stream_options is not None and request.stream_options.include_usage:
            last = CompletionStreamResponse(
                id=request_id, model=self.served_model_name, choices=[], usage=self.usage(choices)
            )
            yield sse(dump(last))
        yield sse("[DONE]")
