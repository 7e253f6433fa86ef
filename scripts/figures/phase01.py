#!/usr/bin/env python3
"""Draw the figure of the Phase 01 chapter from mini_vllm's own SmolLM2-135M model.

    .venv/bin/python scripts/figures/phase01.py              # the figure into book/src/figures/
    .venv/bin/python scripts/figures/phase01.py --only smollm2-bytes.png --out-dir /tmp

The counts come from the model mini_vllm builds: `build_model` makes the real module tree
of the `smollm2-135m` shape on PyTorch's meta device (shapes, no memory, no weights to
load), and the figure groups its named parameters by what they do; the total is checked
against `LlamaConfig.num_parameters()`. The KV-cache bytes come from the same config.
Nothing is timed, so the PNG is deterministic. Same pattern as scripts/figures/phase06.py:
one function a figure, a fixed style, a `FIGURES` dict.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch
from figurekit import draw as _draw  # also puts the checkout on sys.path
from figurekit import styled
from matplotlib.figure import Figure

from mini_vllm.models.config import LlamaConfig, get_model_config
from mini_vllm.models.loader import build_model

__all__ = ["COMPONENTS", "FIGURES", "component_parameters", "kv_bytes_per_token", "bytes_figure"]

SHAPE = "smollm2-135m"
BF16 = 2  # bytes per element
# (label, test on a parameter's name); the first match wins, a tied lm_head counts once.
COMPONENTS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("embedding = tied LM head", lambda n: n.startswith("model.embed_tokens")),
    ("attention: qkv_proj", lambda n: "qkv_proj" in n),
    ("attention: o_proj", lambda n: "o_proj" in n),
    ("MLP: gate_up_proj", lambda n: "gate_up_proj" in n),
    ("MLP: down_proj", lambda n: "down_proj" in n),
    ("RMSNorm weights", lambda n: "norm" in n),
)
_COLORS = ("#7f8c8d", "#2471a3", "#5dade2", "#d68910", "#f5b041", "#27ae60")
_GQA_COLOR = "#2471a3"
_MHA_COLOR = "#c0392b"
_WEIGHT_COLOR = "#7f8c8d"


@functools.lru_cache(maxsize=1)
def component_parameters(shape: str = SHAPE) -> dict[str, int]:
    """Parameters per component of the model mini_vllm builds for `shape` (meta device)."""
    config = get_model_config(shape)
    model = build_model(config, torch.device("meta"), torch.float32)
    counts = dict.fromkeys((label for label, _ in COMPONENTS), 0)
    seen: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:  # the tied head is the embedding's own tensor
            continue
        seen.add(id(param))
        label = next((label for label, test in COMPONENTS if test(name)), None)
        if label is None:
            raise ValueError(f"parameter {name} belongs to no component")
        counts[label] += param.numel()
    total = sum(counts.values())
    if total != config.num_parameters():
        raise AssertionError(f"counted {total}, config says {config.num_parameters()}")
    return counts


def kv_bytes_per_token(config: LlamaConfig, kv_heads: int | None = None, nbytes: int = BF16):
    """K and V, every layer, every KV head: bytes one token adds to the cache."""
    heads = config.num_key_value_heads if kv_heads is None else kv_heads
    return 2 * config.num_hidden_layers * heads * config.head_dim * nbytes


@styled
def bytes_figure(shape: str = SHAPE) -> Figure:
    """Left: where the parameters are. Right: the bytes one decode step reads at batch 1
    in bf16, weights plus KV cache, against the context length, with GQA and without."""
    config = get_model_config(shape)
    counts = component_parameters(shape)
    total = sum(counts.values())
    fig = Figure(figsize=(8.2, 3.7))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1.3, 1)})
    labels = list(counts)[::-1]  # top to bottom in COMPONENTS order
    millions = [counts[label] / 1e6 for label in labels]
    bars = left.barh(range(len(labels)), millions, color=_COLORS[::-1])
    left.bar_label(
        bars,
        labels=[
            f" {counts[label] / 1e6:.1f} M ({counts[label] / total:.0%})"
            if counts[label] >= 1e6
            else f" {counts[label] / 1e3:.0f} k"
            for label in labels
        ],
        fontsize=7,
    )
    left.set_yticks(range(len(labels)), labels, fontsize=8)
    left.set_xlabel("parameters (millions)")
    left.set_xlim(0, max(millions) * 1.45)
    left.set_title(
        f"{total:,} parameters, {total * BF16 / 1e6:.0f} MB in bf16:\n"
        f"every decode step at batch 1 reads them all"
    )
    context = np.linspace(0, config.max_position_embeddings, 65)
    weights_mb = total * BF16 / 1e6
    gqa = kv_bytes_per_token(config) * context / 1e6
    mha = kv_bytes_per_token(config, kv_heads=config.num_attention_heads) * context / 1e6
    right.fill_between(context, 0, weights_mb, color=_WEIGHT_COLOR, alpha=0.35, label="weights")
    right.plot(
        context,
        weights_mb + gqa,
        color=_GQA_COLOR,
        label=f"+ KV cache, {config.num_key_value_heads} KV heads (GQA)",
    )
    right.plot(
        context,
        weights_mb + mha,
        "--",
        color=_MHA_COLOR,
        label=f"+ KV cache, {config.num_attention_heads} KV heads (no GQA)",
    )
    right.set_xlim(0, config.max_position_embeddings)
    right.set_ylim(0, (weights_mb + mha[-1]) * 1.4)
    right.set_xlabel("tokens in the context")
    right.set_ylabel("MB read per decode step (bf16)")
    right.set_title("One decode step: weights + KV cache")
    right.legend(loc="upper left", frameon=False)
    fig.suptitle(
        f"SmolLM2-135M as mini_vllm builds it ({config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}, {config.num_attention_heads} query / "
        f"{config.num_key_value_heads} KV heads of {config.head_dim}, vocabulary "
        f"{config.vocab_size:,})",
        fontsize=8,
        y=0.02,
        va="bottom",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "smollm2-bytes.png": bytes_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
