"""The JSON the OpenAI API takes and gives, as pydantic models.

vLLM counterpart: vllm/entrypoints/openai/completion/protocol.py (`CompletionRequest`,
`CompletionResponse`, `CompletionStreamResponse`), chat_completion/protocol.py
(`ChatCompletionRequest` and its responses) and engine/protocol.py (`ErrorResponse`,
`UsageInfo`, `StreamOptions`, `ModelCard`). Only the fields the engine can honour are read;
a field the engine cannot honour (`n > 1`, `stop`, `logprobs`, tools, ...) is refused with a
400 that names it, so that nobody gets a silent default instead of what they asked for. Other
unknown fields (`user`, `metadata`, ...) are ignored, as by OpenAI's own server.

Two extensions come from vLLM: `top_k` and `ignore_eos` (benchmarks want fixed lengths), and
`return_token_ids`, which adds the generated token ids to each choice (tests compare them with
the offline `LLM`).
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatCompletionStreamResponse",
    "ChatMessage",
    "CompletionRequest",
    "CompletionResponse",
    "CompletionStreamResponse",
    "ErrorInfo",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "UsageInfo",
    "random_id",
]


def random_id(prefix: str) -> str:
    """A request id in OpenAI's style: `cmpl-...`, `chatcmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    # Clients send fields the engine has no use for (user, metadata, ...): accept them.
    model_config = ConfigDict(extra="allow")


# -- errors -----------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    message: str  # what went wrong and what to do instead
    type: str  # "BadRequestError", "NotFoundError", ... (vLLM's names)
    param: str | None = None  # the request field at fault, if one is
    code: int  # the HTTP status


class ErrorResponse(BaseModel):
    error: ErrorInfo


# -- requests ---------------------------------------------------------------------------


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False  # one last chunk with no choices and the usage


class _SamplingRequest(OpenAIBaseModel):
    """What completions and chat share: the model, sampling, streaming."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None  # None: 1.0, OpenAI's default; 0: greedy
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension
    return_token_ids: bool = False  # vLLM's extension: the generated ids in each choice
    # Refused unless left at their defaults (the engine has no such feature):
    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported_fields(self) -> list[str]:
        """The fields set to something the engine cannot do."""
        names = []
        if self.n != 1:
            names.append("n")
        if self.stop:
            names.append("stop")
        if self.logprobs not in (None, False, 0):
            names.append("logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                names.append(name)
        if self.logit_bias:
            names.append("logit_bias")
        return names


class CompletionRequest(_SamplingRequest):
    # text, token ids, or a batch of either (one choice per prompt)
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's and vLLM's default for completions
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported_fields(self) -> list[str]:
        names = super().unsupported_fields()
        if self.echo:
            names.append("echo")
        if self.suffix:
            names.append("suffix")
        if self.best_of not in (None, 1):
            names.append("best_of")
        return names


class TextPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[TextPart] | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    # None (and max_tokens None): as many as the context has room for (vLLM's default)
    max_completion_tokens: int | None = None
    tools: list[dict] | None = None
    response_format: dict | None = None

    def unsupported_fields(self) -> list[str]:
        names = super().unsupported_fields()
        if self.tools:
            names.append("tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            names.append("response_format")
        return names


# -- responses --------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


def _now() -> int:
    return int(time.time())


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while streaming
    token_ids: list[int] | None = None  # with return_token_ids


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None  # only in the last chunk, with include_usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "mini_vllm"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
