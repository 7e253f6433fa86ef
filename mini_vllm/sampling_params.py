"""How one request wants its tokens chosen and when it stops.

vLLM counterpart: vllm/sampling_params.py (`SamplingParams`). Only the options the
course uses exist; anything else is refused up front with the list of what is allowed,
so a typo never silently means "default". Every value is checked here, where the user
made it, so that a bad one never reaches the sampler in the middle of someone's batch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields

from mini_vllm.errors import UserError

__all__ = ["GREEDY_TEMPERATURE", "MIN_SAMPLING_TEMPERATURE", "SamplingParams"]

logger = logging.getLogger(__name__)

# Temperatures below this sample greedily: dividing logits by 1e-38 overflows to inf
# and the softmax of inf is NaN. vLLM names the same bound `_SAMPLING_EPS`.
GREEDY_TEMPERATURE = 1e-5
# A positive temperature below greedy's bound but under this is raised to it, with a
# warning: vLLM's `_MAX_TEMP`, the smallest temperature it samples with.
MIN_SAMPLING_TEMPERATURE = 1e-2
_INT64 = (-(2**63), 2**63 - 1)
MAX_LOGPROBS = 20  # vLLM's default max_logprobs


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, init=False)
class SamplingParams:
    """Sampling options of one request.

    `temperature`: 0 means greedy (argmax). Any temperature below 1e-5 is greedy too,
    and one in [1e-5, 1e-2) is raised to 1e-2 with a warning. vLLM raises every positive
    temperature under 1e-2 to 1e-2, so it samples (almost greedily) where mini_vllm takes
    the argmax; both keep tiny temperatures from dividing the logits into inf.
    """

    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    max_tokens: int = 16  # new tokens to generate at most
    n: int = 1  # completions of the prompt, each drawn on its own
    seed: int | None = None  # per-request generator seed (reproducible sampling), int64
    ignore_eos: bool = False  # keep going past EOS (benchmarks want fixed lengths)
    # What vLLM's SamplingParams adds, each off by default (mini_vllm/layers/logits_processors.py):
    min_p: float = 0.0  # drop tokens below min_p x the most likely one's probability
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per time a token has been generated
    repetition_penalty: float = 1.0  # divides (or, if negative, multiplies) seen tokens' logits
    # Added to those tokens' logits. Not part of the hash (a dict has none).
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    min_tokens: int = 0  # new tokens before EOS or a stop token may end the request
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the request like EOS
    # Strings that end the request where they appear in its text (cut there, unless
    # include_stop_str_in_output); LLM.generate and the server look for them.
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    # Log-probabilities of each generated token (from the model's raw logits, as vLLM's
    # default), with this many most likely alternatives; None: none, 0: the token's own.
    logprobs: int | None = None
    # The same for each prompt token after the first (what the model gave it, seen from
    # the tokens before it); a request asking for them is not served from the prefix cache.
    prompt_logprobs: int | None = None

    def __init__(self, **options: object) -> None:
        allowed = {f.name: f.default for f in fields(self)}
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise UserError(f"unknown sampling option(s) {unknown}; allowed: {', '.join(allowed)}")
        for name, default in allowed.items():
            object.__setattr__(self, name, options.get(name, default))
        self._validate()
        if GREEDY_TEMPERATURE <= self.temperature < MIN_SAMPLING_TEMPERATURE:
            logger.warning(
                "temperature %g is below %g, where the logits divided by it lose precision; "
                "sampling with %g instead (use 0 for greedy decoding)",
                self.temperature,
                MIN_SAMPLING_TEMPERATURE,
                MIN_SAMPLING_TEMPERATURE,
            )
            object.__setattr__(self, "temperature", MIN_SAMPLING_TEMPERATURE)

    # ANCHOR: validate
    def _validate(self) -> None:
        # bool is an int in Python: True would pass as max_tokens=1 or seed=1 unnoticed.
        if not _is_int(self.n) or self.n < 1:
            raise UserError(f"n (completions a prompt) must be an integer >= 1, got {self.n!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise UserError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (_is_number(self.temperature) and math.isfinite(self.temperature)) or (
            self.temperature < 0
        ):
            raise UserError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise UserError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        seed_ok = _is_int(self.seed) and _INT64[0] <= self.seed <= _INT64[1]
        if self.seed is not None and not seed_ok:
            raise UserError(
                f"seed must be an integer in [-2**63, 2**63 - 1] (a torch.Generator's seed) "
                f"or None, got {self.seed!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise UserError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        self._validate_processors()

    def _validate_processors(self) -> None:
        """The ranges vLLM's SamplingParams checks (`_verify_args`)."""
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise UserError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise UserError(f"{name} must be a number in [-2, 2], got {value!r}")
        penalty = self.repetition_penalty
        if not (_is_number(penalty) and math.isfinite(penalty)) or penalty <= 0:
            raise UserError(f"repetition_penalty must be a number > 0 (1: off), got {penalty!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise UserError(
                f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        stop = self.stop_token_ids
        if isinstance(stop, (str, bytes)) or not all(
            _is_int(t) and t >= 0 for t in (stop if isinstance(stop, (list, tuple)) else [None])
        ):
            raise UserError(
                f"stop_token_ids must be a list of token ids (integers >= 0), got {stop!r}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(stop))
        strings = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(strings, (list, tuple)) or not all(
            isinstance(text, str) and text for text in strings
        ):
            raise UserError(
                f"stop must be a string or a list of non-empty strings, got {self.stop!r}"
            )
        object.__setattr__(self, "stop", tuple(strings))
        if self.logprobs is not None and not (
            _is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise UserError(
                f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}] (the most likely "
                f"alternatives to return beside each token), got {self.logprobs!r}"
            )
        if self.prompt_logprobs is not None and not (
            _is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise UserError(
                f"prompt_logprobs must be None or an integer in [0, {MAX_LOGPROBS}] (the most "
                f"likely alternatives to return beside each prompt token), got "
                f"{self.prompt_logprobs!r}"
            )
        if not isinstance(self.include_stop_str_in_output, bool):
            raise UserError(
                "include_stop_str_in_output must be True or False, "
                f"got {self.include_stop_str_in_output!r}"
            )
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, dict) or not all(
                _is_int(t) and t >= 0 and _is_number(b) and math.isfinite(b)
                for t, b in bias.items()
            ):
                raise UserError(
                    f"logit_bias must map token ids (integers >= 0) to finite numbers, got {bias!r}"
                )
            object.__setattr__(self, "logit_bias", dict(bias))

    @property
    def uses_processors(self) -> bool:
        """Whether any option beyond temperature, top-k and top-p changes the logits."""
        return bool(
            self.min_p
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )

    @property
    def uses_history(self) -> bool:
        """Whether the logits depend on the tokens so far (the penalties)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    # ANCHOR_END: validate

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE
