"""What `LLM.generate` returns for each prompt.

vLLM counterpart: vllm/outputs.py (`RequestOutput`, whose `outputs` is a list of
`CompletionOutput`, one a completion asked for). mini_vllm generates one completion a
prompt, so `outputs` has one entry; `text`, `token_ids` and `finish_reason` on the
request itself are that completion's, a shortcut vLLM does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CompletionOutput", "Logprob", "RequestOutput", "logprob_entry"]


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability at one position (vLLM's `Logprob`, vllm/logprobs.py)."""

    logprob: float
    rank: int  # 1: the most likely token at that position
    decoded_token: str | None = None


def logprob_entry(kept: tuple, decode=None) -> dict[int, Logprob]:
    """What the engine keeps of one position, (token, logprob, rank, [(alternative,
    logprob), ...] most likely first), as vLLM's {id: Logprob}: the token's own entry and
    each alternative's; `decode(token_id)` gives each its text (None: no text)."""
    token, logprob, rank, alternatives = kept

    def text(token_id: int) -> str | None:
        return decode(token_id) if decode is not None else None

    entry = {token: Logprob(logprob, rank, text(token))}
    for alt_rank, (alternative, alt_logprob) in enumerate(alternatives, start=1):
        entry.setdefault(alternative, Logprob(alt_logprob, alt_rank, text(alternative)))
    return entry


# ANCHOR: completion_output
@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt (vLLM's `CompletionOutput`)."""

    index: int  # which completion of the request (0: the only one here)
    text: str  # the generated text ("" without a tokenizer)
    token_ids: list[int]  # the generated tokens
    # "stop" (EOS), "length" (max_tokens or max_model_len), "error" or "abort"
    finish_reason: str
    # What stopped it when finish_reason is "stop": the stop token's id (None: EOS).
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None  # None: log-probabilities were not asked for
    # One {token id: Logprob} a generated token: the token's own and the top alternatives.
    logprobs: list[dict[int, Logprob]] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


# ANCHOR_END: completion_output


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    error: str | None = None  # why the request failed, when finish_reason is "error"
    # With SamplingParams.prompt_logprobs: one {id: Logprob} a prompt token (the token's own
    # and the top alternatives), None for the first, which nothing predicts (vLLM's form).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def text(self) -> str:
        """The first completion's text: `outputs[0].text`."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        """The first completion's tokens: `outputs[0].token_ids`."""
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    @property
    def ok(self) -> bool:
        """Finished normally: on EOS or a length limit, not failed or aborted."""
        return self.finish_reason in ("stop", "length")
