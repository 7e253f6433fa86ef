"""How one request wants its tokens chosen and when it stops.

vLLM counterpart: vllm/sampling_params.py (`SamplingParams`). Only the options the
course uses exist; anything else is refused up front with the list of what is allowed,
so a typo never silently means "default". Every value is checked here, where the user
made it, so that a bad one never reaches the sampler in the middle of someone's batch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

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
    seed: int | None = None  # per-request generator seed (reproducible sampling), int64
    ignore_eos: bool = False  # keep going past EOS (benchmarks want fixed lengths)

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

    # ANCHOR_END: validate

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE
