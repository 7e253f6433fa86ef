"""One request's state, as the scheduler and the block manager see it.

vLLM counterpart: vllm/v1/request.py (`Request`, `RequestStatus`); nano-vllm's
nanovllm/engine/sequence.py (`Sequence`) is the smaller cousin this one is named after.

One number drives everything: `num_computed_tokens`, how many of the sequence's
tokens (prompt first, then generated) already have their K/V in the paged cache.
Each step the scheduler hands a sequence some of its `num_new_tokens =
num_tokens - num_computed_tokens`: the prompt (whole, or a chunk of it) at first,
then exactly one token a step while decoding — the token sampled last step, whose
K/V does not exist yet. There is no separate "phase" field to keep in sync: prefill
and decode are read off the two counters, as in vLLM V1's scheduler.

Preemption by recompute keeps the generated tokens and sets `num_computed_tokens`
back to 0, so the next admission "prefills" prompt + generated tokens in one go
(or in chunks) and then carries on decoding where it stopped.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Collection, Hashable, Iterable

from mini_vllm.errors import UserError
from mini_vllm.sampling_params import SamplingParams

__all__ = ["FinishReason", "PLACEHOLDER", "Sequence", "SequenceStatus", "check_stop"]

# The token id of a place reserved for a token not sampled yet (async scheduling). Never
# a real id: the runner feeds that row from the previous step's samples on the device.
PLACEHOLDER = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued: new, or preempted and waiting to be recomputed
    RUNNING = "running"  # admitted: holds KV blocks, gets tokens each step the budget allows
    FINISHED = "finished"  # done for good (see finish_reason); holds no blocks


class FinishReason(str, enum.Enum):
    """Why a request ended. Each member is also its plain string: `FinishReason.STOP == "stop"`."""

    STOP = "stop"  # sampled the EOS token (and ignore_eos is off)
    LENGTH = "length"  # reached max_tokens, or max_model_len
    ERROR = "error"  # can never run: too long for the model or for the whole KV cache
    ABORT = "abort"  # ended by its caller (LLMEngine.abort_request), as vLLM's ABORT

    def __str__(self) -> str:
        return self.value


# ANCHOR: check_stop
def check_stop(
    token_id: int,
    num_generated: int,
    params: SamplingParams,
    eos_token_ids: Collection[int],
    num_tokens: int | None = None,
    max_model_len: int | None = None,
) -> FinishReason | None:
    """Why a request stops after appending `token_id`, its `num_generated`-th new token, or None.

    STOP: one of `stop_token_ids`, or an end-of-sequence token (unless `ignore_eos`);
    LENGTH: `max_tokens` new tokens, or `num_tokens` (prompt + generated) has reached
    `max_model_len`. The stop tokens and EOS are checked before the length limits, so
    one on the last allowed token is a STOP: the order of vLLM's `check_stop`.
    """
    if token_id in params.stop_token_ids:  # before min_tokens, the sampler never draws them
        return FinishReason.STOP
    if not params.ignore_eos and token_id in eos_token_ids:
        return FinishReason.STOP
    if num_generated >= params.max_tokens:
        return FinishReason.LENGTH
    if max_model_len is not None and num_tokens is not None and num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


# ANCHOR_END: check_stop


def as_token_id(value: object) -> int:
    """An int token id; numpy/torch integer scalars are accepted through __index__."""
    if isinstance(value, bool):
        raise TypeError(f"token ids are integers, got the bool {value!r}")
    try:
        token = operator.index(value)
    except TypeError:
        raise TypeError(f"token ids are integers, got {type(value).__name__} {value!r}") from None
    if token < 0:
        raise UserError(f"token ids are >= 0, got {token}")
    return token


class Sequence:
    """A request: its tokens, how far its KV cache has got, and where that cache lives.

    `seq_id` is any hashable id the engine picks (unique among live requests);
    `arrival` is set by the scheduler when the request is added (its FCFS rank).
    """

    def __init__(
        self,
        seq_id: Hashable,
        prompt_token_ids: Iterable[int],
        sampling_params: SamplingParams | None = None,
    ) -> None:
        prompt = tuple(as_token_id(t) for t in prompt_token_ids)
        if not prompt:
            raise UserError(f"request {seq_id!r} has an empty prompt; it needs at least one token")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}"
            )
        self.seq_id = seq_id
        self.prompt_token_ids: tuple[int, ...] = prompt
        self.num_prompt_tokens = len(prompt)
        self.sampling_params = sampling_params
        # Prompt and generated tokens in one list: the recompute after a preemption and
        # the block hashes of prefix caching both slice across the boundary.
        self._token_ids: list[int] = list(prompt)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None  # the message, when finish_reason is ERROR
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.block_table: list[int] = []  # physical KV block ids, in token order
        self.arrival: int | None = None
        self.num_preemptions = 0
        # Async scheduling (mini_vllm/engine/async_scheduler.py): tokens sampled by a
        # step still on the device, held at the end of the token list as PLACEHOLDER.
        self.num_output_placeholders = 0
        # sampling_params.logprobs set: output place -> (token, logprob, rank, top
        # [(id, logprob)]), written by the model runner when it samples.
        self.token_logprobs: dict[int, tuple] = {}
        # sampling_params.prompt_logprobs set: prompt position (1 on) -> the same tuple.
        self.prompt_logprobs: dict[int, tuple] = {}

    # -- token counts -------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens."""
        return len(self._token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(self._token_ids[len(self.prompt_token_ids) :])

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Prompt + generated tokens (a copy)."""
        return tuple(self._token_ids)

    @property
    def last_token_id(self) -> int:
        return self._token_ids[-1]

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids at positions start..end-1 (no copy of the whole sequence)."""
        return self._token_ids[start:end]

    # -- progress -----------------------------------------------------------------

    # ANCHOR: progress
    @property
    def num_new_tokens(self) -> int:
        """Tokens whose K/V is still missing: the prompt at first, then 1 a step."""
        return len(self._token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while the sequence has prompt tokens (or, after a preemption, prompt
        and generated tokens) to compute before it can decode one token a step.

        A decoding sequence has computed everything but its last sampled token, so
        it is in prefill exactly when num_computed_tokens is below both the prompt
        length and num_tokens - 1 (the test vLLM's scheduler uses to tell a fresh or
        resumed prefill from a decode).
        """
        return self.num_computed_tokens < max(self.num_prompt_tokens, len(self._token_ids) - 1)

    # ANCHOR_END: progress

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Record a sampled token (its K/V is computed at the next step)."""
        if self.is_finished:
            raise RuntimeError(
                f"request {self.seq_id!r} is finished "
                f"({self.finish_reason.value}); it takes no more tokens"
            )
        self._token_ids.append(as_token_id(token_id))

    # ANCHOR: placeholders
    def append_placeholder(self) -> None:
        """Reserve the place of a token that a step in flight will sample."""
        self._token_ids.append(PLACEHOLDER)
        self.num_output_placeholders += 1

    def resolve_placeholder(self, token_id: int) -> None:
        """The oldest placeholder's token has arrived: write it in its place."""
        if self.num_output_placeholders == 0:
            raise RuntimeError(f"request {self.seq_id!r} has no token in flight to resolve")
        self._token_ids[len(self._token_ids) - self.num_output_placeholders] = as_token_id(token_id)
        self.num_output_placeholders -= 1

    def drop_placeholders(self) -> None:
        """Forget the tokens still in flight (the request stopped before them)."""
        if self.num_output_placeholders:
            del self._token_ids[-self.num_output_placeholders :]
            self.num_output_placeholders = 0

    # ANCHOR_END: placeholders

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """Mark the request done. The caller (the scheduler) frees its blocks first."""
        if (reason is FinishReason.ERROR) != (error is not None):
            raise ValueError("an error message goes with FinishReason.ERROR, and only with it")
        self.drop_placeholders()  # tokens in flight for it will be thrown away
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error

    def __repr__(self) -> str:
        state = (
            self.status.value if not self.is_finished else f"finished:{self.finish_reason.value}"
        )
        return (
            f"Sequence({self.seq_id!r}, {state}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
