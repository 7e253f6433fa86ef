"""Lab 03, part 1 — CUDAGraphMode and the downgrade rule (your code).

Mirrors mini_vllm/config/compilation.py, which mirrors vllm/config/compilation.py and
`GPUModelRunner._check_and_update_cudagraph_mode` in vllm/v1/worker/gpu_model_runner.py.
The member values are given; write the methods and `resolve_cudagraph_mode`.
Run: pytest labs/phase-05/lab-03-cudagraph-mode -k modes
"""

from __future__ import annotations

import enum


class CUDAGraphMode(enum.Enum):
    """A plain member is one mode for every batch; a tuple member is
    (mode for uniform-decode batches, mode for mixed batches)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True for the tuple members: decode and mixed batches are routed apart."""
        raise NotImplementedError("TODO: is self.value a tuple?")

    def decode_mode(self) -> CUDAGraphMode:
        """The mode for uniform-decode batches: element 0 of a tuple, else the mode itself."""
        raise NotImplementedError("TODO: CUDAGraphMode(self.value[0]) for pairs")

    def mixed_mode(self) -> CUDAGraphMode:
        """The mode for mixed prefill/decode batches: element 1 of a tuple, else the mode itself."""
        raise NotImplementedError("TODO: CUDAGraphMode(self.value[1]) for pairs")

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """Does this (possibly paired) mode use `mode` for some batch?
        `mode` must be a single mode: raise ValueError for a pair."""
        raise NotImplementedError("TODO: membership in the pair, or identity")

    def requires_piecewise_compilation(self) -> bool:
        """Piecewise graphs need the model compiled in pieces split at attention."""
        raise NotImplementedError("TODO: one line with has_mode")

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """The 'largest' mode used for any batch (NONE < PIECEWISE < FULL)."""
        raise NotImplementedError("TODO: max over the pair's values")

    def has_full_cudagraphs(self) -> bool:
        raise NotImplementedError("TODO: is the max mode FULL?")

    def valid_runtime_modes(self) -> bool:
        """Can this member be the mode ONE forward runs under? Only NONE, PIECEWISE, FULL."""
        raise NotImplementedError("TODO")

    @classmethod
    def from_name(cls, name: str | CUDAGraphMode) -> CUDAGraphMode:
        """Given: parse 'full_and_piecewise', 'FULL-DECODE-ONLY', ... ."""
        if isinstance(name, cls):
            return name
        key = str(name).strip().upper().replace("-", "_")
        if key not in cls.__members__:
            raise ValueError(
                f"unknown CUDAGraphMode {name!r}; choose one of: {', '.join(cls.__members__)}"
            )
        return cls.__members__[key]


class AttentionCGSupport(enum.IntEnum):
    """Given: how much of a batch an attention backend can run inside one full graph."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


def resolve_cudagraph_mode(
    mode: CUDAGraphMode | str,
    attn_support: AttentionCGSupport,
    attention_is_split: bool,
    uniform_decode_query_len: int = 1,
) -> CUDAGraphMode:
    """Downgrade the requested mode to what the attention backend supports.

    Apply, in order (COURSE_SPEC §4; the book's deep dive has the table):
    0. without attention as a split point: PIECEWISE -> NONE, FULL_AND_PIECEWISE -> FULL;
    1. mixed mode FULL and support below ALWAYS: NEVER -> ValueError; otherwise
       FULL_AND_PIECEWISE if attention is split, else FULL_DECODE_ONLY;
    2. decode mode FULL and support NEVER: PIECEWISE if attention is split, else NONE;
    3. decode mode FULL, query length > 1, support below UNIFORM_BATCH:
       PIECEWISE if attention is split, else NONE;
    4. full graphs left on a NEVER backend: ValueError.
    """
    mode = CUDAGraphMode.from_name(mode)
    raise NotImplementedError("TODO: apply the rules in order and return the mode")
