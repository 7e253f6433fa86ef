"""What the current forward is: its batch descriptor,
graph runtime mode, attention metadata and layers.

vLLM counterpart: vllm/forward_context.py (`BatchDescriptor`, `ForwardContext`,
`set_forward_context`, `get_forward_context`). The model runner sets the context
around each forward; the graph wrappers and the attention layers read it instead of
taking extra arguments, so the model's forward signature never changes. The compiled
attention op finds its layer here too, by name (`no_compile_layers`), so nothing
outside the engine that runs a model holds on to its layers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["BatchDescriptor", "ForwardContext", "get_forward_context", "set_forward_context"]


# ANCHOR: batch_descriptor
class BatchDescriptor(NamedTuple):
    """The key a captured graph is stored under. Hashable, so it can key a dict."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False  # every request has the same query length (uniform decode)

    def relax_for_mixed_batch_cudagraphs(self) -> BatchDescriptor:
        """The key a graph that serves any batch of this many tokens is stored under."""
        return BatchDescriptor(self.num_tokens, num_reqs=None, uniform=False)


# ANCHOR_END: batch_descriptor


@dataclass
class ForwardContext:
    """Per-forward state read by layers deep inside the model."""

    cudagraph_runtime_mode: Any  # a CUDAGraphMode that is a valid runtime mode
    batch_descriptor: BatchDescriptor | None
    attn_metadata: Any = None
    # The model's attention layers by `layer_name` (vLLM: the static forward context of
    # the engine's compilation config): where the opaque attention op finds its layer.
    no_compile_layers: dict[str, Any] = field(default_factory=dict)
    # A dummy run whose attention results nobody reads (the warm-up and capture of
    # PIECEWISE graphs, which leave attention out): attention writes zeros and does no
    # work. vLLM signals it with `attn_metadata=None`; here that stays a mistake with
    # its own error, and a dummy run says what it is.
    skip_attention: bool = False


# The context of the forward running in this thread (or asyncio task). A context
# variable, not a module global: two engines stepping in two threads each see their
# own, where a global would hand one engine's attention metadata to the other's layers
# mid-step. (vLLM keeps one global: each of its engine processes runs one engine.)
_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "mini_vllm_forward_context", default=None
)


def get_forward_context() -> ForwardContext:
    context = _current.get()
    if context is None:
        raise RuntimeError(
            "no forward context is set: run the model through the "
            "model runner (or inside `with set_forward_context(...)`)"
        )
    return context


@contextlib.contextmanager
def set_forward_context(
    cudagraph_runtime_mode: Any,
    batch_descriptor: BatchDescriptor | None = None,
    attn_metadata: Any = None,
    no_compile_layers: dict[str, Any] | None = None,
    skip_attention: bool = False,
) -> Iterator[ForwardContext]:
    context = ForwardContext(
        cudagraph_runtime_mode,
        batch_descriptor,
        attn_metadata,
        no_compile_layers or {},
        skip_attention,
    )
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
