"""The JSON the OpenAI API takes and gives, as pydantic models.

vLLM counterpart: vllm/entrypoints/openai/completion/protocol.py (`CompletionRequest`,
`CompletionResponse`, `CompletionStreamResponse`), chat_completion/protocol.py
(`ChatCompletionRequest`, its `validate_stream_options` and `check_logprobs` validators, and its
responses) and engine/protocol.py (`ErrorResponse`, `UsageInfo`, `StreamOptions`, `ModelCard`).

What a request may hold, field by field, so that nobody gets a silent default instead of what
they asked for:

- The fields the server honours are declared below with their types. A value of the wrong type
  is refused with a 400 naming the field (vLLM's status for a schema error).
- The sampling options of vLLM's API are served: `n`, `stop`, `stop_token_ids`,
  `include_stop_str_in_output`, `min_tokens`, the presence, frequency and repetition
  penalties, `min_p`, `logit_bias` (token ids as strings, OpenAI's form), and `logprobs`
  (completions: how many alternatives; chat: `logprobs` and `top_logprobs`).
- Fields of OpenAI's or vLLM's API that mini_vllm does not serve yet (`best_of`,
  `prompt_logprobs`, `echo` in chat, tools, ...: `NOT_YET` below) are accepted only at the
  value that asks for nothing, which is what clients send when the user left them alone
  (`"best_of": 1`, `"echo": false`); any other value is refused with a 400 that names the
  field and says it is not supported yet. (vLLM's V1 engine has dropped `best_of` too.)
- One request may ask for at most 128 choices a prompt (`n`, OpenAI's bound) and 1024 in
  all (prompts times `n`).
- Any other field is refused as unknown, by name: a typo (`"max_token"`) would otherwise run
  with the default. vLLM only logs a warning for an unknown field; OpenAI's own API refuses it.
- `user` and `metadata` are accepted and change nothing, as in vLLM.
- `model` may be left out: it means the served model (vLLM's rule).
- Completions also take vLLM's `prompt_logprobs`, and `echo` with `logprobs` puts the
  prompt's tokens, their log-probabilities and alternatives first in the logprobs.
- Two combinations vLLM refuses are refused: `stream_options` without `"stream": true`, and
  (chat) `top_logprobs` without `"logprobs": true`.

Two extensions come from vLLM: `top_k` and `ignore_eos` (benchmarks want fixed lengths), and
`return_token_ids`, which adds the generated token ids to each choice (tests compare them with
the offline `LLM`).
"""

from __future__ import annotations

import reprlib
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "NOT_YET",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatCompletionStreamResponse",
    "ChatLogProb",
    "ChatLogProbs",
    "ChatLogProbsContent",
    "ChatMessage",
    "CompletionLogProbs",
    "CompletionRequest",
    "CompletionResponse",
    "CompletionStreamResponse",
    "ErrorInfo",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "RequestFieldError",
    "UsageInfo",
    "clip",
    "random_id",
]


def random_id(prefix: str) -> str:
    """A request id in OpenAI's style: `cmpl-...`, `chatcmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 6
_SHORT.maxlevel = 3


def clip(value: object) -> str:
    """`repr(value)`, cut to about a hundred characters: an error message may quote what the
    client sent, never all of it (a 10 MiB field would come back whole otherwise)."""
    return _SHORT.repr(value)


class RequestFieldError(ValueError):
    """A request that parses but cannot be served as written: a 400 naming `param`."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class OpenAIBaseModel(BaseModel):
    # Extra fields are kept, so that the request's validator can name each one: refused as
    # unknown, or as not supported yet (NOT_YET), or accepted at their neutral value.
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

# Fields of OpenAI's or vLLM's requests that mini_vllm does not serve yet, each with the values
# that ask for nothing. The engine's SamplingParams may have some of these options already:
# until the server passes one on (and shapes its answer, for logprobs), it is refused here.
NOT_YET: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1),
    "prompt_logprobs": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1),
    "echo": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "priority": (None, 0),
    "request_id": (None,),
    "cache_salt": (None,),
    "kv_transfer_params": (None,),
    "vllm_xargs": (None,),
    "logits_processors": (None,),
    "return_tokens_as_token_ids": (None, False),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
}
# Completions serve echo (the prompt's text before the answer) and prompt_logprobs.
_SERVED_BY_COMPLETIONS = ("echo", "prompt_logprobs")
_NOT_YET_COMPLETION = {n: v for n, v in NOT_YET.items() if n not in _SERVED_BY_COMPLETIONS} | {
    "suffix": (None, ""),
    "add_special_tokens": (None, True),
}
_NOT_YET_CHAT = NOT_YET | {
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "add_special_tokens": (None, False),  # the chat template holds the special tokens
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "documents": (None,),
    "mm_processor_kwargs": (None,),
    "reasoning_effort": (None,),
    "include_reasoning": (None, True),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
}


# A list checked up to its first bad item: pydantic would otherwise report every bad item of
# every member of a union, and build each error on the event loop (seconds for a megabyte
# of them).
_FailFast = Field(fail_fast=True)
_Ids = Annotated[list[int], _FailFast]


def _asks_for_nothing(value: object, neutral: tuple[object, ...]) -> bool:
    # `True == 1` and `False == 0` in Python: `"n": true` is no neutral `"n": 1`.
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


class StreamOptions(BaseModel):
    # A typo inside stream_options is refused like one at the top.
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = False  # one last chunk with no choices and the usage
    continuous_usage_stats: bool | None = False  # vLLM's: usage in every chunk (not yet)


class _SamplingRequest(OpenAIBaseModel):
    """What completions and chat share: the model, sampling, streaming."""

    not_yet_fields: ClassVar[dict[str, tuple[object, ...]]] = NOT_YET
    endpoint: ClassVar[str] = ""

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = None  # None: 1.0, OpenAI's default; 0: greedy
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension
    return_token_ids: bool | None = False  # vLLM's extension: the generated ids in each choice
    user: str | None = None  # OpenAI's end-user id; nothing here reads it (nor in vLLM)
    metadata: dict[str, Any] | None = None  # OpenAI's tags for stored completions; idem
    # The sampling options of vLLM's SamplingParams (None: the engine's default). Checked by
    # SamplingParams itself, whose message names the field.
    n: int | None = None  # choices a prompt, each drawn on its own
    stop: str | Annotated[list[str], _FailFast] | None = None
    stop_token_ids: _Ids | None = None
    include_stop_str_in_output: bool | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (a string, as JSON keys are) -> bias

    @model_validator(mode="after")
    def _refuse_unknown_fields_and_conflicts(self) -> Any:
        for name in self.model_extra or {}:
            if name not in self.not_yet_fields:
                known = ", ".join(sorted(type(self).model_fields))
                raise RequestFieldError(
                    f"unknown field {clip(name)} in a {self.endpoint} request: check its "
                    f"spelling (mini_vllm refuses a field it does not know rather than run "
                    f"without it); the fields it reads are {known}",
                    name,
                )
        if self.stream_options is not None and not self.stream:
            raise RequestFieldError(
                'stream_options is only allowed with "stream": true (vLLM\'s rule too): add '
                '"stream": true, or leave stream_options out',
                "stream_options",
            )
        return self

    def unsupported_fields(self) -> list[str]:
        """The fields set to something mini_vllm does not serve yet."""
        extra = self.model_extra or {}
        names = [  # in the table's order, not the client's: the same request, the same error
            name
            for name, neutral in self.not_yet_fields.items()
            if name in extra and not _asks_for_nothing(extra[name], neutral)
        ]
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            names.append("stream_options.continuous_usage_stats")
        return names

    def neutral_value(self, name: str) -> object:
        """What to send instead of an unsupported field's value (None: leave it out)."""
        neutral = self.not_yet_fields.get(name, (None,))
        return next((value for value in neutral if value is not None), None)


class CompletionRequest(_SamplingRequest):
    not_yet_fields: ClassVar[dict[str, tuple[object, ...]]] = _NOT_YET_COMPLETION
    endpoint: ClassVar[str] = "/v1/completions"

    # text, token ids, or a batch of either (one choice per prompt)
    prompt: str | _Ids | Annotated[list[str], _FailFast] | Annotated[list[_Ids], _FailFast]
    max_tokens: int | None = 16  # OpenAI's and vLLM's default for completions
    # The log-probability of each generated token and of this many most likely
    # alternatives (OpenAI allows up to 5; vLLM, and here, up to 20).
    logprobs: int | None = None
    echo: bool | None = False  # the prompt's text first, then the completion
    # vLLM's extension: each prompt token's log-probability (after the first) and this many
    # most likely alternatives, in each choice's `prompt_logprobs`.
    prompt_logprobs: int | None = None

    @property
    def num_prompts(self) -> int:
        """Prompts in the request (a batch is a list of texts or of id lists)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or not isinstance(prompt[0], (str, list)):
            return 1  # one text, or one list of ids
        return len(prompt)


class TextPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    # Other keys of a message (`name`, ...) are accepted; the template sees role and content.
    role: str
    content: str | Annotated[list[TextPart], _FailFast] | None = None


class ChatCompletionRequest(_SamplingRequest):
    not_yet_fields: ClassVar[dict[str, tuple[object, ...]]] = _NOT_YET_CHAT
    endpoint: ClassVar[str] = "/v1/chat/completions"

    messages: Annotated[list[ChatMessage], _FailFast]
    # Taken over max_tokens when both are set (vLLM's rule). Both None: as many as the context
    # has room for (vLLM's default).
    max_completion_tokens: int | None = None
    parallel_tool_calls: bool | None = None  # no tools are served, so it changes nothing
    logprobs: bool | None = False  # each generated token's log-probability
    top_logprobs: int | None = None  # and this many most likely alternatives (0 to 20)

    @model_validator(mode="after")
    def _refuse_top_logprobs_without_logprobs(self) -> Any:
        top = self.top_logprobs
        if top is not None and top != 0 and not self.logprobs:
            raise RequestFieldError(
                'top_logprobs needs "logprobs": true (vLLM\'s rule too): add it, or leave '
                "top_logprobs out",
                "top_logprobs",
            )
        return self


# -- responses --------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


def _now() -> int:
    return int(time.time())


class CompletionLogProbs(BaseModel):
    """OpenAI's legacy completions form: one entry a token in each list."""

    text_offset: list[int] = Field(default_factory=list)  # where the token starts in the text
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    # vLLM's: {token id: its logprob, rank, text} a prompt token, None for the first
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while streaming
    # vLLM's: what ended a "stop", the stop string or the stop token's id (None: EOS)
    stop_reason: str | int | None = None
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


class ChatLogProb(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None  # the token's text as UTF-8


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: list[ChatLogProbsContent] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
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
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
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
