"""The one door from the model's layers to mini_vllm's own kernels, and the switch that
closes it.

vLLM counterpart: vllm/_custom_ops.py (one Python function per kernel, `rms_norm`,
`fused_add_rms_norm`, `rotary_embedding`, `silu_and_mul`, ..., each calling the compiled
op) and the `custom_ops` setting of vllm/config/compilation.py (`CompilationConfig`), which
`CustomOp.enabled()` in vllm/model_executor/custom_op.py reads when a layer is built.

A layer's `forward_native` is plain torch and always there (mini_vllm/layers/custom_op.py).
Its `forward_cuda` and `forward_cpu` call a function of this table, which hands the work to
mini_vllm/kernels/: Triton kernels on CUDA (RMSNorm, RoPE, SwiGLU's gate, the decode
products, paged decode attention), and on the CPU the tricks that make a 2-core machine
fast (products split over the cores, column-major weights, RoPE without a copy). The
kernels do what the native code does, to the last bit where the tests say so, faster.

The switch, by op name (`CUSTOM_OPS`), with vLLM's syntax: "all" or "none", then "+name"
or "-name" to turn one op on or off ("none,+rms_norm", "-linear"). It is the engine option
`custom_ops` (`LLM(..., custom_ops="none")`, `--custom-ops none`), or by default the
environment variable MINI_VLLM_CUSTOM_OPS, else "all". A layer reads it when it is built;
the engine sets it again on every layer of the model it runs. With "none", the engine runs
torch alone: CUDA graphs and torch.compile still on, no kernel of mini_vllm's own.

The kernels are found by name the first time an op is enabled, so nothing in the core
imports them: if the package cannot be imported (or is removed), every op is off, with
the reason in the engine's log and in `python -m mini_vllm doctor`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from mini_vllm import envs
from mini_vllm.errors import UserError

__all__ = [
    "CUSTOM_OPS",
    "current_custom_ops",
    "custom_ops_context",
    "enabled",
    "kernels_status",
    "parse_custom_ops",
]

logger = logging.getLogger(__name__)

# The ops that have kernels, by the name the switch uses (vLLM's CustomOp names where
# vLLM has the op).
CUSTOM_OPS = ("rms_norm", "rotary_embedding", "silu_and_mul", "linear", "paged_attention")
ENV_VAR = "MINI_VLLM_CUSTOM_OPS"

# The switch set around the code running now (the loader sets it while it builds a model;
# a thread building another model sees its own).
_current: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "mini_vllm_custom_ops", default=None
)


# ANCHOR: parse_custom_ops
def parse_custom_ops(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The ops a `custom_ops` setting turns on. None reads MINI_VLLM_CUSTOM_OPS ("all"
    when unset); a string is a comma-separated list."""
    where = "custom_ops"
    if spec is None:
        where, spec = ENV_VAR, envs.MINI_VLLM_CUSTOM_OPS
    if isinstance(spec, str):
        spec = [part for part in spec.replace(" ", "").split(",") if part]
    elif not isinstance(spec, (list, tuple)) or not all(isinstance(s, str) for s in spec):
        raise UserError(
            f"{where} must be a string or a list of strings such as ['none', '+rms_norm'], "
            f"got {spec!r}"
        )
    chosen = set(CUSTOM_OPS)
    for entry in spec:
        if entry in ("all", "none"):
            chosen = set(CUSTOM_OPS) if entry == "all" else set()
        elif entry[:1] in ("+", "-") and entry[1:] in CUSTOM_OPS:
            (chosen.add if entry[0] == "+" else chosen.discard)(entry[1:])
        else:
            raise UserError(
                f"{where}: {entry!r} is not understood; give 'all', 'none', or '+name' / "
                f"'-name' with a name from: {', '.join(CUSTOM_OPS)}"
            )
    return frozenset(chosen)


# ANCHOR_END: parse_custom_ops


def current_custom_ops() -> frozenset[str]:
    """The setting around the code running now: a `custom_ops_context`'s, else
    MINI_VLLM_CUSTOM_OPS's."""
    chosen = _current.get()
    return chosen if chosen is not None else parse_custom_ops(None)


@contextlib.contextmanager
def custom_ops_context(spec: str | Iterable[str] | frozenset[str] | None) -> Iterator[None]:
    """Build layers and engines under this setting (what the model loader wraps a model's
    construction in; the labs run the reference's plain torch code in one). None keeps
    the setting around it."""
    if spec is None:
        yield
        return
    chosen = spec if isinstance(spec, frozenset) else parse_custom_ops(spec)
    token = _current.set(chosen)
    try:
        yield
    finally:
        _current.reset(token)


_kernels_module: Any = None
_kernels_error: str | None = None


def _load_kernels() -> Any:
    """mini_vllm/kernels/, imported the first time an op is enabled; None where it cannot be."""
    global _kernels_module, _kernels_error
    if _kernels_module is None and _kernels_error is None:
        try:
            _kernels_module = importlib.import_module("mini_vllm.kernels")
        except ImportError as error:
            _kernels_error = f"mini_vllm.kernels cannot be imported ({error})"
            logger.warning("%s: every layer runs its plain torch version", _kernels_error)
    return _kernels_module


def enabled(name: str, chosen: frozenset[str] | None = None) -> bool:
    """Whether the op `name` runs its kernels: it is switched on (`chosen`, by default
    `current_custom_ops()`) and the kernels import."""
    if chosen is None:
        chosen = current_custom_ops()
    return name in chosen and _load_kernels() is not None


def kernels_status(chosen: frozenset[str] | None = None) -> str:
    """One phrase for the engine's log and `doctor`: which ops run own kernels."""
    chosen = current_custom_ops() if chosen is None else chosen
    if not chosen:
        return "off (custom_ops=none: plain torch)"
    if _load_kernels() is None:
        return f"off ({_kernels_error})"
    return "on: " + ", ".join(op for op in CUSTOM_OPS if op in chosen)


# --- the ops: each hands its work to mini_vllm/kernels/ ----------------------------------
# Called only by a layer whose op is enabled, so the kernels are loaded.


# ANCHOR: table
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x), or with `residual` (RMSNorm(x + residual), x + residual), in one kernel."""
    return _kernels_module.rms_norm(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE of query `[T, H*D]` and key `[T, Hkv*D]` by a RotaryEmbedding's
    table; on CUDA in place."""
    return _kernels_module.rotary_embedding(positions, query, key, cos_sin_cache)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of rows `[gate | up]`."""
    return _kernels_module.silu_and_mul(gate_up)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T: the GEMV kernels for decode rows on CUDA, the product split over the
    cores on the CPU; the library's product otherwise."""
    return _kernels_module.linear(x, weight)


def linear_compiled(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear` as Dynamo should trace it: one graph serves every row count, so the choice
    is made at run time inside an opaque op (CUDA), or the split traced for all rows (CPU)."""
    return _kernels_module.linear_compiled(x, weight)


def new_linear_weight(output_size: int, input_size: int) -> torch.Tensor:
    """An uninitialised `[out, in]` weight on the default device, laid out for `linear`."""
    return _kernels_module.new_linear_weight(output_size, input_size)


def linear_layout(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in `linear`'s layout: itself, or a copy (a tied LM head on the CPU)."""
    return _kernels_module.linear_layout(weight)


# ANCHOR_END: table


# ANCHOR: fusable_ops
# What a layer emits while Dynamo traces it for the fusion passes: one `mini_vllm::` op a
# pass can recognise and fold into its neighbour (mini_vllm/compilation/passes/fusion.py;
# vLLM's passes match its `torch.ops._C` ops the same way).
def rms_norm_op(x, weight, eps, residual=None):
    if residual is None:
        return torch.ops.mini_vllm.rms_norm(x, weight, eps)
    return torch.ops.mini_vllm.fused_add_rms_norm(x, residual, weight, eps)


def rotary_embedding_op(positions, query, key, cos_sin_cache):
    return tuple(torch.ops.mini_vllm.rotary_embedding(positions, query, key, cos_sin_cache))


def silu_and_mul_op(gate_up):
    return torch.ops.mini_vllm.silu_and_mul(gate_up)


def linear_op(x, weight):
    return torch.ops.mini_vllm.linear(x, weight)


# ANCHOR_END: fusable_ops


def paged_attention_backend(device: torch.device) -> Any:
    """The paged attention backend with the Triton decode kernels (an `AttentionBackend`),
    where they run on `device`; None elsewhere."""
    return _kernels_module.paged_attention_backend(device)


def autotune_seconds() -> float:
    """Seconds this process spent tuning and compiling the kernels at their first launches
    (0 where the kernels never loaded)."""
    return _kernels_module.autotune_seconds() if _kernels_module is not None else 0.0


def require_kernels(purpose: str) -> None:
    """Load the kernels for `purpose`, or say clearly why they cannot be."""
    if _load_kernels() is None:
        raise RuntimeError(
            f"{purpose} need mini_vllm's kernels, and {_kernels_error}; turn it off or "
            "reinstall mini_vllm"
        )
