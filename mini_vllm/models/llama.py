"""Llama (and SmolLM2, which is a Llama): the model of Phase 01.

vLLM counterpart: vllm/model_executor/models/llama.py (`LlamaMLP`, `LlamaAttention`,
`LlamaDecoderLayer`, `LlamaModel`, `LlamaForCausalLM`, `load_weights`); nano-vllm:
nanovllm/models/qwen3.py (same structure). Hugging Face's version, the numerical
reference: transformers/models/llama/modeling_llama.py.

vLLM's conventions, kept on purpose:
- Flattened inputs. `forward(input_ids [T], positions [T]) -> hidden [T, hidden]`:
  there is no batch dimension; the tokens of all sequences in a step are laid end to
  end and each carries its own position. What belongs to which sequence is the
  attention backend's business (its metadata), nobody else's.
- Logits are a separate call, `compute_logits(hidden)`, made only for the rows that
  will be sampled (usually one per sequence): the LM head is the biggest matrix of a
  small model, and prefill would otherwise multiply it by every prompt token.
- Fused projections (`qkv_proj`, `gate_up_proj`): fewer, fuller matrix products.
- Attention is its own layer (`self.attn`) with no weights: the seam where backends
  are swapped and where later phases split the forward for graphs and compile.
- Tensor parallelism lives in the layers (mini_vllm/layers/linear.py): qkv and gate_up
  are column-parallel, o and down row-parallel (an all-reduce each), so a rank holds
  `heads / tp` query heads and its share of the KV heads, and the code below reads the
  same for one rank or eight.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from mini_vllm.compilation.decorators import support_torch_compile
from mini_vllm.distributed.parallel_state import get_tensor_model_parallel_world_size
from mini_vllm.errors import UserError
from mini_vllm.layers.activation import SiluAndMul
from mini_vllm.layers.attention import Attention
from mini_vllm.layers.layernorm import RMSNorm
from mini_vllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from mini_vllm.layers.rotary_embedding import RotaryEmbedding
from mini_vllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from mini_vllm.models.config import LlamaConfig

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaForCausalLM", "LlamaMLP", "LlamaModel"]


def _same_layout(param: torch.Tensor, tensor: torch.Tensor) -> bool:
    return (
        param.dtype == tensor.dtype
        and param.device == tensor.device
        and param.shape == tensor.shape
        and param.stride() == tensor.stride()
    )


# ANCHOR: llama_mlp
class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up as one matrix."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size]
        )
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


# ANCHOR_END: llama_mlp


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
        )
        # This rank's heads: all of them with one rank.
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(config.q_size, config.hidden_size)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            layer_idx,
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            config.head_dim,
            scale=config.head_dim**-0.5,
        )

    # ANCHOR: attention_forward
    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        # -- before attention: project and rotate (pure tensor math, capturable)
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        # -- attention: the backend writes the cache and attends (changes every step).
        # Its output buffer is allocated here, before the split point, so that under
        # piecewise CUDA graphs it lives in the captured piece at a fixed address.
        attn_output = self.attn(q, k, v, torch.empty_like(q))
        # -- after attention: back to the residual stream's width
        return self.o_proj(attn_output)

    # ANCHOR_END: attention_forward


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx, rotary_emb)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)

    # ANCHOR: decoder_layer_forward
    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream is carried separately and added inside the next norm
        # (vLLM's pattern), so "x + f(norm(x))" costs no extra pass.
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual

    # ANCHOR_END: decoder_layer_forward


# ANCHOR: decorated_model
@support_torch_compile
class LlamaModel(nn.Module):
    # ANCHOR_END: decorated_model
    def __init__(self, config: LlamaConfig, rope_is_neox_style: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # One cos/sin table shared by all layers (vLLM's `get_rope` caches it the same
        # way): at 8192 positions it is 2 MB, times 30 layers otherwise.
        rotary_emb = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            is_neox_style=rope_is_neox_style,
            scaling=config.rope_scaling,
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, rotary_emb) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    # ANCHOR: llama_model_forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    # ANCHOR_END: llama_model_forward


class LlamaForCausalLM(nn.Module):
    # Checkpoint name fragment -> (fused parameter fragment, shard id); vLLM keeps
    # the same table in `LlamaModel.load_weights` (stacked_params_mapping), which
    # `LlamaForCausalLM.load_weights` reaches through `AutoWeightsLoader`.
    # ANCHOR: stacked_params_mapping
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]
    # ANCHOR_END: stacked_params_mapping

    def __init__(self, config: LlamaConfig, rope_is_neox_style: bool = True) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, rope_is_neox_style)
        # ANCHOR: tied_head
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # ANCHOR_END: tied_head

    # ANCHOR: model_forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions `[T]` -> final hidden states `[T, hidden]` (no logits)."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Hidden states of the rows to sample `[N, hidden]` -> logits `[N, vocab]`."""
        return self.lm_head(hidden_states)

    # ANCHOR_END: model_forward

    # ANCHOR: load_weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (Hugging Face names) into this model's parameters.

        Separate q/k/v and gate/up tensors land in their rows of the fused matrices; under
        tensor parallelism each layer's `weight_loader` keeps this rank's shard. Raises if
        a tensor has no home or a parameter got no tensor.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        unexpected: list[str] = []
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue  # older checkpoints store RoPE frequencies; they are computed here
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # the head is the embedding table
            for fused, piece, shard_id in self.stacked_params_mapping:
                if piece in name:
                    target = name.replace(piece, fused)
                    if target not in params:
                        unexpected.append(name)
                        break
                    param = params[target]
                    param.weight_loader(param, tensor, shard_id)
                    loaded.add(f"{target}:{shard_id}")
                    break
            else:
                if name not in params:
                    unexpected.append(name)
                    continue
                param = params[name]
                if get_tensor_model_parallel_world_size() > 1 and hasattr(param, "weight_loader"):
                    param.weight_loader(param, tensor)  # keeps this rank's shard
                    loaded.add(name)
                    continue
                if tuple(param.shape) != tuple(tensor.shape):
                    raise UserError(
                        f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                        f"model {tuple(param.shape)}"
                    )
                if _same_layout(param.data, tensor):
                    # Adopt the loader's tensor instead of copying it: writing a fresh
                    # copy of every weight costs more than the read on a small VM.
                    param.data = tensor
                else:
                    param.data.copy_(tensor)
                loaded.add(name)
        if unexpected:
            raise UserError(
                "checkpoint tensors with no place in the model: "
                f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
            )
        missing = [n for n in self._expected_checkpoint_keys() if n not in loaded]
        if missing:
            raise UserError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")
        return loaded

    # ANCHOR_END: load_weights

    def _expected_checkpoint_keys(self) -> list[str]:
        keys = []
        for name, _ in self.named_parameters():
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            if name.endswith("qkv_proj.weight"):
                keys += [f"{name}:{s}" for s in ("q", "k", "v")]
            elif name.endswith("gate_up_proj.weight"):
                keys += [f"{name}:{s}" for s in (0, 1)]
            else:
                keys.append(name)
        return keys

    def process_weights_after_loading(self) -> None:
        """Let each layer re-lay out its weights for the device (vLLM's hook of the same name)."""
        for module in self.modules():
            if module is not self and hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This model's weights under Hugging Face Llama names, fused matrices split again.

        Lets transformers' LlamaForCausalLM run the very same weights (the reference
        in tests and benchmarks).
        """
        if get_tensor_model_parallel_world_size() > 1:
            raise RuntimeError(
                "hf_state_dict gives the whole model's weights, but this rank holds a "
                "tensor-parallel shard of them; build the model with one rank to export it"
            )
        q, kv = self.config.q_size, self.config.kv_size
        inter = self.config.intermediate_size
        for name, param in self.named_parameters():
            t = param.data
            if name.endswith("qkv_proj.weight"):
                base = name.replace("qkv_proj.weight", "")
                yield base + "q_proj.weight", t[:q]
                yield base + "k_proj.weight", t[q : q + kv]
                yield base + "v_proj.weight", t[q + kv :]
            elif name.endswith("gate_up_proj.weight"):
                base = name.replace("gate_up_proj.weight", "")
                yield base + "gate_proj.weight", t[:inter]
                yield base + "up_proj.weight", t[inter:]
            elif name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            else:
                yield name, t
