"""The scheduler's limits: how many requests and tokens one step may hold.

vLLM counterpart: vllm/config/scheduler.py (`SchedulerConfig`: `max_num_seqs`,
`max_num_batched_tokens`, `enable_chunked_prefill`) and `max_model_len` from
vllm/config/model.py. Only the knobs the course's scheduler uses exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.errors import UserError

__all__ = ["SchedulerConfig"]


# ANCHOR: scheduler_config
@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16  # requests running at once (rows of a decode batch)
    max_num_batched_tokens: int = 512  # tokens one step may compute, all requests together
    max_model_len: int = 2048  # prompt + generated tokens one request may reach
    enable_chunked_prefill: bool = True  # split a prompt that does not fit the step's budget
    # ANCHOR_END: scheduler_config

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}")
        # The same two checks vLLM's SchedulerConfig makes: every running request
        # must be able to decode in one step, and without chunking every prompt
        # must fit in one step, or the scheduler could wait forever.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise UserError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): each running request needs a token a step to decode"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise UserError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}) so that the "
                "longest prompt fits in one step; raise it or set enable_chunked_prefill=True"
            )
