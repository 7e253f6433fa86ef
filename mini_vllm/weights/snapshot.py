"""Save a loaded model's parameters exactly as they sit in memory, and load them back fast.

vLLM counterpart: vllm/model_executor/model_loader/sharded_state_loader.py
(`ShardedStateLoader`: save the state dict after `process_weights_after_loading`, so a
reload skips all conversion). Hugging Face safetensors is the container.

What is saved is the model's own parameters: fused q/k/v and gate/up matrices, the
CPU column-major layout (stored as the transposed, contiguous matrix and listed under
`transposed` in the file's metadata) and the LM head's own copy. Loading on the same
device and dtype then adopts views into one sequential read of the file: no copy, no
transposition, and no second touch of fresh memory, which is what a load costs on a
small VM. On another device, dtype or layout the tensors are copied into the model's
parameters (and a tied head is left to the embedding).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mini_vllm.errors import UserError
from mini_vllm.weights.hf_dir import read_safetensors_file

__all__ = ["SNAPSHOT_FILE", "load_snapshot", "save_snapshot"]

SNAPSHOT_FILE = "model.safetensors"


def _is_column_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()


def save_snapshot(model: nn.Module, path: str | Path) -> None:
    from safetensors.torch import save_file

    tensors, transposed = {}, []
    for name, param in model.named_parameters():
        data = param.data.detach().to("cpu")
        if _is_column_major(data):
            data = data.t()  # the bytes as they are in memory: [in, out], contiguous
            transposed.append(name)
        tensors[name] = data.contiguous()
    save_file(
        tensors, str(Path(path) / SNAPSHOT_FILE), metadata={"transposed": json.dumps(transposed)}
    )


def load_snapshot(model: nn.Module, path: str | Path) -> None:
    """Fill `model` (built by `build_model`) from a snapshot directory."""
    file = Path(path) / SNAPSHOT_FILE
    metadata, tensors = read_safetensors_file(file)
    transposed = set(json.loads(metadata.get("transposed", "[]")))
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    expected = {name for name, _ in model.named_parameters()}
    seen = set()
    for name, tensor in tensors:
        if name in transposed:
            tensor = tensor.t()
        module_name, attr = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        param = getattr(module, attr, None)
        if not isinstance(param, nn.Parameter) or tuple(param.shape) != tuple(tensor.shape):
            raise UserError(
                f"snapshot tensor {name} {tuple(tensor.shape)} does not fit the model: the cache "
                f"entry {Path(path)} is damaged or stale; delete it and load again (it is rebuilt)"
            )
        seen.add(name)
        same_place = tensor.device == param.device and tensor.dtype == param.dtype
        tied_head = name == "lm_head.weight" and tied
        if same_place and (tensor.stride() == param.stride() or tied_head):
            # Adopt the view: a new Parameter (this also unties a tied head, which on
            # CPU keeps its own column-major copy).
            new = nn.Parameter(tensor, requires_grad=False)
            if hasattr(param, "weight_loader"):
                new.weight_loader = param.weight_loader
            setattr(module, attr, new)
        elif tied_head:
            continue  # on this device the head is the embedding table again
        else:
            param.data.copy_(tensor)
    missing = expected - seen - ({"lm_head.weight"} if tied else set())
    if missing:
        raise UserError(
            f"snapshot {file} lacks {sorted(missing)[:5]}: the cache entry is "
            f"damaged or stale; delete {Path(path)} and load again (it is rebuilt)"
        )
