"""The mode enums of Phase 05 and the rule that downgrades a requested graph mode.

vLLM counterpart: vllm/config/compilation.py (`CUDAGraphMode`, `CompilationMode`),
vllm/v1/attention/backends/utils.py (`AttentionCGSupport`) and
vllm/v1/worker/gpu_model_runner.py (`_check_and_update_cudagraph_mode`, here
`resolve_cudagraph_mode`). The values and the methods follow vLLM so that a reader
can put this file next to the real one.
"""

from __future__ import annotations

import enum

from mini_vllm.errors import UserError

__all__ = ["AttentionCGSupport", "CUDAGraphMode", "CompilationMode", "resolve_cudagraph_mode"]


def _parse_member(enum_cls: type[enum.Enum], name: str | enum.Enum | int):
    """Look a member up by name (any case, '-' or '_') or value, or say what is allowed."""
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


# ANCHOR: cudagraph_mode
class CUDAGraphMode(enum.Enum):
    """Which CUDA graphs the engine captures and replays.

    A plain member is one mode for every batch. A tuple member is a pair
    (mode for uniform-decode batches, mode for mixed prefill/decode batches).
    """

    # ANCHOR: cudagraph_mode_pairs
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True when decode and mixed batches get different modes."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        if mode.separate_routine():
            raise ValueError(f"has_mode() takes a single mode, not the pair {mode.name}")
        if self.separate_routine():
            return mode.value in self.value
        return self is mode

    # ANCHOR_END: cudagraph_mode_pairs

    def requires_piecewise_compilation(self) -> bool:
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(max(self.value)) if self.separate_routine() else self

    def has_full_cudagraphs(self) -> bool:
        return self.max_cudagraph_mode() is CUDAGraphMode.FULL

    def valid_runtime_modes(self) -> bool:
        """Only NONE, PIECEWISE and FULL can be what a single forward runs under."""
        return self in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)

    @classmethod
    def from_name(cls, name: str | CUDAGraphMode) -> CUDAGraphMode:
        return _parse_member(cls, name)


# ANCHOR_END: cudagraph_mode


# ANCHOR: compilation_mode
class CompilationMode(enum.IntEnum):
    """How much of the model torch.compile sees (vLLM's compilation level)."""

    NONE = 0  # plain eager PyTorch
    STOCK_TORCH_COMPILE = 1  # torch.compile of the whole model, Dynamo may retrace
    DYNAMO_TRACE_ONCE = 2  # one Dynamo trace, guards dropped, never recompiles
    VLLM_COMPILE = 3  # one trace, split at attention, Inductor per piece, graphs per piece

    @classmethod
    def from_name(cls, name: str | int | CompilationMode) -> CompilationMode:
        return _parse_member(cls, name)


# ANCHOR_END: compilation_mode


# ANCHOR: attention_cg_support
class AttentionCGSupport(enum.IntEnum):
    """How much of a batch an attention backend can run inside one full CUDA graph."""

    NEVER = 0  # metadata must be rebuilt on the host every step
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # only batches where every request decodes one token
    UNIFORM_BATCH = 2  # any batch where every request has the same query length
    ALWAYS = 3  # any batch, prefill included


# ANCHOR_END: attention_cg_support


# ANCHOR: resolve_cudagraph_mode
def resolve_cudagraph_mode(
    mode: CUDAGraphMode | str,
    attn_support: AttentionCGSupport,
    attention_is_split: bool,
    uniform_decode_query_len: int = 1,
) -> CUDAGraphMode:
    """Downgrade the requested mode to what the attention backend can run.

    `attention_is_split` says whether attention is a splitting op of a piecewise
    compile (without it there is nothing to put piecewise graphs around).
    """
    mode = CUDAGraphMode.from_name(mode)
    attn_support = AttentionCGSupport(attn_support)
    if uniform_decode_query_len < 1:
        raise UserError(f"uniform_decode_query_len must be >= 1, got {uniform_decode_query_len}")

    # ANCHOR: downgrade_rules
    # Piecewise graphs need split points; without them fall back to what remains.
    if not attention_is_split:
        if mode is CUDAGraphMode.PIECEWISE:
            mode = CUDAGraphMode.NONE
        elif mode is CUDAGraphMode.FULL_AND_PIECEWISE:
            mode = CUDAGraphMode.FULL

    # 1. Full graphs for mixed batches need a backend that is capturable for any batch.
    if mode.mixed_mode() is CUDAGraphMode.FULL and attn_support < AttentionCGSupport.ALWAYS:
        if attn_support is AttentionCGSupport.NEVER:
            raise UserError(
                f"cudagraph mode {mode.name} needs full graphs, but the attention backend "
                "declares AttentionCGSupport.NEVER; use PIECEWISE (with attention split) or NONE"
            )
        mode = (
            CUDAGraphMode.FULL_AND_PIECEWISE
            if attention_is_split
            else CUDAGraphMode.FULL_DECODE_ONLY
        )

    # 2. No full graphs at all for this backend.
    if mode.decode_mode() is CUDAGraphMode.FULL and attn_support is AttentionCGSupport.NEVER:
        mode = CUDAGraphMode.PIECEWISE if attention_is_split else CUDAGraphMode.NONE
    # ANCHOR_END: downgrade_rules

    # 3. Uniform decode with several query tokens a request (speculative decoding).
    if (
        mode.decode_mode() is CUDAGraphMode.FULL
        and uniform_decode_query_len > 1
        and attn_support < AttentionCGSupport.UNIFORM_BATCH
    ):
        mode = CUDAGraphMode.PIECEWISE if attention_is_split else CUDAGraphMode.NONE

    # 4. Safety net: nothing above may leave full graphs on a backend that cannot run them.
    if mode.has_full_cudagraphs() and attn_support is AttentionCGSupport.NEVER:
        raise ValueError(
            f"cudagraph mode {mode.name} keeps full graphs on a NEVER-capturable backend"
        )
    return mode


# ANCHOR_END: resolve_cudagraph_mode
