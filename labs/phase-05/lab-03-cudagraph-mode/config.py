"""Lab 03, steps 1 and 2 — CUDAGraphMode and the downgrade rule (your code).

Mirrors vLLM's `CUDAGraphMode` (vllm/config/compilation.py) and the mode check of
`GPUModelRunner._check_and_update_cudagraph_mode` (vllm/v1/worker/gpu_model_runner.py).
The member values, the name parser and `AttentionCGSupport` are given; write the
methods marked TODO and `resolve_cudagraph_mode`. Each TODO's docstring says what must
hold, with a worked example; it does not say how.

Run: pytest labs/phase-05/lab-03-cudagraph-mode -m step1   (then -m step2)
"""

from __future__ import annotations

import enum

from mini_vllm.errors import UserError  # a ValueError the CLI prints without a traceback


def _parse_member(enum_cls: type[enum.Enum], name: str | enum.Enum | int):
    """Given: look a member up by name (any case, '-' or '_') or value, or say what is allowed."""
    if isinstance(name, enum_cls):
        return name
    if isinstance(name, str):
        key = name.strip().upper().replace("-", "_")
        if key in enum_cls.__members__:
            return enum_cls.__members__[key]
    else:
        try:
            return enum_cls(name)
        except ValueError:
            pass
    allowed = ", ".join(m.name for m in enum_cls)
    raise UserError(f"unknown {enum_cls.__name__} {name!r}; choose one of: {allowed}")


class CUDAGraphMode(enum.Enum):
    """Which CUDA graphs the engine captures and replays.

    A plain member is one mode for every batch. A tuple member is a pair
    (mode for uniform-decode batches, mode for mixed prefill/decode batches).
    Enum members whose value is a tuple are members like the others:
    `CUDAGraphMode((2, 1))` is FULL_AND_PIECEWISE and `CUDAGraphMode(2)` is FULL.
    """

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True exactly for the pair members (uniform decode and mixed batches are routed
        apart). FULL_DECODE_ONLY -> True; FULL -> False."""
        raise NotImplementedError("TODO: step 1")

    def decode_mode(self) -> CUDAGraphMode:
        """The single mode a uniform-decode batch runs under.
        FULL_DECODE_ONLY -> FULL; PIECEWISE -> PIECEWISE."""
        raise NotImplementedError("TODO: step 1")

    def mixed_mode(self) -> CUDAGraphMode:
        """The single mode a mixed prefill/decode batch runs under.
        FULL_DECODE_ONLY -> NONE; FULL_AND_PIECEWISE -> PIECEWISE; FULL -> FULL."""
        raise NotImplementedError("TODO: step 1")

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """Does some kind of batch (uniform decode or mixed) run under the single mode `mode`?
        FULL_AND_PIECEWISE.has_mode(PIECEWISE) -> True; FULL.has_mode(PIECEWISE) -> False.
        `mode` must be a single mode: a pair is a ValueError."""
        raise NotImplementedError("TODO: step 1")

    def requires_piecewise_compilation(self) -> bool:
        """True when some batch runs PIECEWISE graphs (the model must be compiled in pieces
        split at attention). FULL_AND_PIECEWISE -> True; FULL_DECODE_ONLY -> False."""
        raise NotImplementedError("TODO: step 1")

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """The largest single mode any batch runs under, in the order NONE < PIECEWISE < FULL.
        FULL_DECODE_ONLY -> FULL; PIECEWISE -> PIECEWISE."""
        raise NotImplementedError("TODO: step 1")

    def has_full_cudagraphs(self) -> bool:
        """True when some batch replays a FULL graph. FULL_DECODE_ONLY -> True."""
        raise NotImplementedError("TODO: step 1")

    def valid_runtime_modes(self) -> bool:
        """Can this member be the mode ONE forward runs under? A forward runs one kind of
        graph, so only the single modes can: NONE, PIECEWISE, FULL -> True; pairs -> False."""
        raise NotImplementedError("TODO: step 1")

    @classmethod
    def from_name(cls, name: str | CUDAGraphMode) -> CUDAGraphMode:
        return _parse_member(cls, name)


class AttentionCGSupport(enum.IntEnum):
    """Given: how much of a batch an attention backend can run inside one full CUDA graph."""

    NEVER = 0  # metadata must be rebuilt on the host every step
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # only batches where every request decodes one token
    UNIFORM_BATCH = 2  # any batch where every request has the same query length
    ALWAYS = 3  # any batch, prefill included


def resolve_cudagraph_mode(
    mode: CUDAGraphMode | str,
    attn_support: AttentionCGSupport,
    attention_is_split: bool,
    uniform_decode_query_len: int = 1,
) -> CUDAGraphMode:
    """The mode the engine really runs: the requested `mode`, downgraded to what the
    attention backend (`attn_support`) and the compilation (`attention_is_split`: is
    attention a splitting op, so that there are pieces to capture around it?) allow.
    `uniform_decode_query_len` (q) is the number of tokens each request computes in a
    uniform-decode batch (1, or more with speculative decoding).

    The result satisfies:
    - it uses PIECEWISE only if attention is split. Without the split, a request for
      PIECEWISE gives NONE, and one for FULL_AND_PIECEWISE is treated as a request for FULL;
    - it runs mixed batches under FULL only on an ALWAYS backend. A weaker backend (but not
      NEVER) keeps FULL for uniform decode and gives mixed batches PIECEWISE if attention
      is split, else nothing (NONE);
    - it runs uniform decode under FULL only if the backend can: at least
      UNIFORM_SINGLE_TOKEN_DECODE when q == 1, at least UNIFORM_BATCH when q > 1. When
      decode loses FULL the result is one single mode: PIECEWISE if attention is split,
      else NONE;
    - a mode the backend and the split already allow comes back unchanged.
    Errors (ValueError): FULL for mixed batches (after the split rule above) asked of a
    NEVER backend; q < 1.

    Example: (FULL, UNIFORM_BATCH, split, q=1) -> FULL_AND_PIECEWISE (mixed batches lose
    FULL, which needs ALWAYS; uniform decode keeps it; attention is split, so mixed
    batches get PIECEWISE).
    """
    raise NotImplementedError("TODO: step 2")
