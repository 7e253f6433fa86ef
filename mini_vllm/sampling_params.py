"""How one request wants its tokens chosen and when it stops.

vLLM counterpart: vllm/sampling_params.py (`SamplingParams`). Only the options the
course uses exist; anything else is refused up front with the list of what is allowed,
so a typo never silently means "default".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from mini_vllm.errors import UserError

__all__ = ["SamplingParams"]


@dataclass(frozen=True, init=False)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy (argmax)
    top_k: int = -1  # -1 or 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    max_tokens: int = 16  # new tokens to generate at most
    seed: int | None = None  # per-request generator seed (reproducible sampling)
    ignore_eos: bool = False  # keep going past EOS (benchmarks want fixed lengths)

    def __init__(self, **options: object) -> None:
        allowed = {f.name: f.default for f in fields(self)}
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise UserError(f"unknown sampling option(s) {unknown}; allowed: {', '.join(allowed)}")
        for name, default in allowed.items():
            object.__setattr__(self, name, options.get(name, default))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise UserError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (
            not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature))
            or self.temperature < 0
        ):
            raise UserError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise UserError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise UserError(f"seed must be an integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
