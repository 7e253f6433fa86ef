"""What `LLM.generate` returns for each prompt.

vLLM counterpart: vllm/outputs.py (`RequestOutput`, `CompletionOutput`), folded into
one class since mini_vllm generates one completion per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestOutput"]


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    text: str  # the generated text ("" without a tokenizer)
    token_ids: list[int]  # the generated tokens
    # "stop" (EOS), "length" (max_tokens or max_model_len), "error" or "abort"
    finish_reason: str
    error: str | None = None  # why the request failed, when finish_reason is "error"

    @property
    def ok(self) -> bool:
        """Finished normally: on EOS or a length limit, not failed or aborted."""
        return self.finish_reason in ("stop", "length")
