"""`POST /v1/chat/completions`: a conversation in, the assistant's next message out.

vLLM counterpart: vllm/entrypoints/openai/chat_completion/serving.py (`OpenAIServingChat`:
`create_chat_completion`, `chat_completion_stream_generator`) with
vllm/entrypoints/chat_utils.py (`apply_hf_chat_template`, `load_chat_template`).

The messages are rendered with the model's chat template (SmolLM2-135M-Instruct has one),
or with the template given to the server (`--chat-template`, a file or the template itself,
as vLLM's flag), and tokenized without adding special tokens: the template holds them. A
model with neither (the random-weight models) refuses chat with a 400 that says what to do.
A streamed answer starts with a chunk whose delta is `{"role": "assistant", "content": ""}`,
then one chunk per step with the new text, the last one with the `finish_reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response

from mini_vllm.entrypoints.async_llm import AsyncLLM, RequestOutputDelta
from mini_vllm.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatStreamChoice,
    DeltaMessage,
)
from mini_vllm.entrypoints.openai.serving_engine import (
    ChoiceState,
    OpenAIServing,
    ServingError,
    check_unicode,
    dump,
    sse,
    token_text,
)
from mini_vllm.errors import UserError
from mini_vllm.sampling_params import MAX_LOGPROBS
from mini_vllm.tokenizer import render_chat_template

__all__ = ["OpenAIServingChat", "load_chat_template"]


def load_chat_template(template: str | None) -> str | None:
    """`--chat-template`: a file's path, or the Jinja template itself (vLLM accepts both)."""
    if template is None:
        return None
    path = Path(template)
    try:
        is_file = path.is_file()
    except OSError:  # a long inline template is no valid path
        is_file = False
    if is_file:
        return path.read_text(encoding="utf-8")
    if "{{" in template or "{%" in template:
        return template
    raise UserError(
        f"--chat-template {template!r} is neither a file nor a Jinja template; give the path "
        "of a .jinja file, or the template text itself"
    )


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self, async_llm: AsyncLLM, served_model_name: str, chat_template: str | None = None
    ) -> None:
        super().__init__(async_llm, served_model_name)
        self.chat_template = chat_template  # the server's, over the model's own

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        self.check_request(request)
        # Rendering, tokenizing and checking every id grow with the conversation: off the loop.
        ids = await asyncio.to_thread(self._prompt_ids, request)
        if request.max_completion_tokens is not None:  # OpenAI's name, over the older one
            max_tokens, param = request.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens, param = request.max_tokens, "max_tokens"
        params = self.sampling_params(request, len(ids), max_tokens, param)
        return await self.respond(request, raw_request, "chatcmpl", [ids], [params])

    def requested_logprobs(self, request: ChatCompletionRequest) -> int | None:
        if not request.logprobs:
            return None
        top = request.top_logprobs or 0
        if not 0 <= top <= MAX_LOGPROBS:
            raise ServingError(
                f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {top}",
                400,
                "top_logprobs",
            )
        return top

    def whole_response(self, request, request_id, choices) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=request_id,
            model=self.served_model_name,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=AssistantMessage(content=c.text),
                    logprobs=self._logprobs(request, c.token_ids, c.logprobs),
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=c.token_ids if request.return_token_ids else None,
                )
                for c in choices
            ],
            usage=self.usage(choices),
        )

    def _logprobs(
        self, request: ChatCompletionRequest, token_ids: list[int], entries: list
    ) -> ChatLogProbs | None:
        """OpenAI's chat logprobs: each token, its log-probability and its UTF-8 bytes, with
        its `top_logprobs` most likely alternatives."""
        if not request.logprobs:
            return None
        tokenizer = self.engine.tokenizer

        def entry_of(token: int, logprob: float) -> ChatLogProb:
            text = token_text(tokenizer, token)
            return ChatLogProb(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

        content = []
        for token, entry in zip(token_ids, entries):
            if entry is None:
                continue
            first = entry_of(token, entry[1])
            top = [entry_of(t, lp) for t, lp in entry[3][: request.top_logprobs or 0]]
            content.append(ChatLogProbsContent(**first.model_dump(), top_logprobs=top))
        return ChatLogProbs(content=content)

    def _prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        """The conversation as checked prompt token ids. Runs in a worker thread."""
        return self.check_prompt(self._render(request), "messages")

    def _render(self, request: ChatCompletionRequest) -> list[int]:
        """The conversation as prompt token ids, through the chat template."""
        if not request.messages:
            raise ServingError("messages is empty: give at least one message", 400, "messages")
        messages = []
        for i, message in enumerate(request.messages):
            content = message.content
            if isinstance(content, list):  # content parts: text only
                kinds = sorted({part.type for part in content if part.type != "text"})
                if kinds:
                    raise ServingError(
                        f"messages[{i}] has content of type {', '.join(kinds)}: this model "
                        "reads text only",
                        400,
                        "messages",
                    )
                content = "".join(part.text or "" for part in content)
            check_unicode(message.role, f"messages[{i}].role")
            check_unicode(content or "", f"messages[{i}].content")
            messages.append({"role": message.role, "content": content or ""})
        tokenizer = self.engine.tokenizer
        template = self.chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise ServingError(
                f"the model {self.engine.model!r} has no chat template, so it cannot chat: "
                "use /v1/completions, or start the server with --chat-template FILE",
                400,
                "messages",
            )
        try:
            if self.chat_template is None:  # the model's own, rendered as `generate --chat` does
                text = tokenizer.apply_chat_template(messages)
            else:
                specials = getattr(tokenizer, "special_tokens", {})
                text = render_chat_template(template, messages, True, **specials)
        except Exception as exc:  # a template's raise_exception, or a template error
            message = f"the chat template refused the messages: {exc}"
            raise ServingError(message, 400, "messages") from None
        return self.encode(text, "messages", add_special_tokens=False)

    async def stream_events(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        choices: list[ChoiceState],
        deltas: AsyncIterator[tuple[int, RequestOutputDelta]],
    ) -> AsyncIterator[str]:
        def chunk(choice: ChatStreamChoice) -> str:
            response = ChatCompletionStreamResponse(
                id=request_id, model=self.served_model_name, choices=[choice]
            )
            return sse(dump(response))

        for choice in choices:  # each choice's first chunk names the role
            yield chunk(
                ChatStreamChoice(
                    index=choice.index, delta=DeltaMessage(role="assistant", content="")
                )
            )
        async with contextlib.aclosing(deltas):
            async for index, delta in deltas:
                if delta.finish_reason == "error":
                    yield self.stream_error(delta)
                    return
                choice = choices[index]
                text = self.take(request_id, choice, delta)
                if text is None:  # ended by a stop string already
                    continue
                yield chunk(
                    ChatStreamChoice(
                        index=index,
                        delta=DeltaMessage(content=text),
                        logprobs=self._logprobs(request, delta.new_token_ids, delta.logprobs or []),
                        finish_reason=choice.finish_reason,
                        stop_reason=choice.stop_reason,
                        token_ids=delta.new_token_ids if request.return_token_ids else None,
                    )
                )
        if request.stream_options is not None and request.stream_options.include_usage:
            last = ChatCompletionStreamResponse(
                id=request_id, model=self.served_model_name, choices=[], usage=self.usage(choices)
            )
            yield sse(dump(last))
        yield sse("[DONE]")
