"""The shape of a Llama-family model, and the named shapes the course uses.

vLLM counterpart: the Hugging Face `LlamaConfig` that vLLM reads through
vllm/config/model.py (`ModelConfig.hf_config`) and passes to
vllm/model_executor/models/llama.py. Here it is a plain dataclass, so a reader sees
every number the model depends on in one place.

Named shapes (`get_model_config(name)`):
- ``tiny``: a toy model for fast tests (random weights; byte-sized vocabulary).
- ``smollm2-135m``: the real SmolLM2-135M shape (COURSE_SPEC section 6).
- ``llama-3.2-1b-like``: the Llama-3.2-1B shape, for GPU performance work.
- ``llama-3.1-8b-like``: the Llama-3.1-8B shape (16 GB in bf16), for the GPU measurements
  of scripts/gpu/factcheck.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mini_vllm.errors import UserError

__all__ = ["LlamaConfig", "MODEL_CONFIGS", "get_model_config"]


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None, or Hugging Face's description of a frequency rescaling, e.g.
    # {"rope_type": "llama3", "factor": 32.0, ...}; only "llama3" is implemented.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    # Llama 3 checkpoints list several end tokens; keep them all.
    eos_token_id: int | tuple[int, ...] | None = 2
    # Std of the normal draw random weights get (Hugging Face's name for it).
    initializer_range: float = 0.02
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = tuple(self.eos_token_id)
        self.validate()

    # ANCHOR: config_derived
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    # ANCHOR_END: config_derived

    def validate(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"model config: num_attention_heads ({self.num_attention_heads}) "
                "must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise UserError(
                f"model config: head_dim must be even for rotary embeddings, got {self.head_dim}"
            )

    # ANCHOR: num_parameters
    def num_parameters(self) -> int:
        """Parameter count, counting a tied embedding once."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + layers * per_layer + h + head

    # ANCHOR_END: num_parameters

    # ANCHOR: config_from_hf
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str = "custom") -> LlamaConfig:
        """Read a Hugging Face `config.json` of a Llama checkpoint.

        Handles both spellings of the RoPE settings: transformers 4.x (`rope_theta`,
        `rope_scaling`) and 5.x (`rope_parameters` holding both).
        """
        model_type = hf.get("model_type", "llama")
        if model_type != "llama":
            raise UserError(
                f"only Llama checkpoints are supported; config.json says model_type={model_type!r}"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag):
                raise UserError(f"{flag}=true is not supported (mini_vllm's Llama has no biases)")
        if hf.get("hidden_act", "silu") != "silu":
            raise UserError(f"only hidden_act='silu' is supported, got {hf['hidden_act']!r}")
        rope_params = dict(hf.get("rope_parameters") or {})
        theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling")
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = rope_params
        if scaling is not None:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            elif kind != "llama3":
                raise UserError(f"RoPE scaling type {kind!r} is not supported (only 'llama3')")
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            name=name,
        )

    # ANCHOR_END: config_from_hf

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` transformers' LlamaForCausalLM needs to build this shape."""
        eos = self.eos_token_id
        hf: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
            "initializer_range": self.initializer_range,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }
        return hf


# ANCHOR: model_configs
# A table: one named shape every few lines (the formatter would give each field a line).
# fmt: off
MODEL_CONFIGS: dict[str, LlamaConfig] = {
    # 4 query heads share 2 KV heads, so GQA grouping is exercised; the vocabulary
    # covers the 256 bytes plus BOS/EOS so the byte tokenizer can drive it. Weights of
    # std 0.2, not 0.02: at 0.02 the residual stream is the last token's embedding and
    # greedy decoding repeats it whatever came before, so a test could not tell a
    # correct KV cache from a corrupted one (tests/engine/test_engine.py checks it can).
    "tiny": LlamaConfig(
        vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=256, eos_token_id=257, initializer_range=0.2, name="tiny",
    ),
    "smollm2-135m": LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, name="smollm2-135m",
    ),
    # Llama-3.2-1B's shape without its long-context RoPE rescaling; 8192 positions
    # are plenty for the GPU timing work it exists for.
    "llama-3.2-1b-like": LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=128000, eos_token_id=128001, name="llama-3.2-1b-like",
    ),
    # Llama-3.1-8B's shape (8.03e9 parameters, untied head), likewise without its RoPE
    # rescaling: GPU measurements at the size most published decode numbers are for.
    "llama-3.1-8b-like": LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=128000, eos_token_id=128001, name="llama-3.1-8b-like",
    ),
}
# fmt: on
# ANCHOR_END: model_configs


def get_model_config(name: str) -> LlamaConfig:
    """A fresh copy of a named shape (callers may change it without side effects)."""
    try:
        config = MODEL_CONFIGS[name]
    except KeyError:
        raise UserError(
            f"unknown model config {name!r}; known configs: {', '.join(MODEL_CONFIGS)}"
        ) from None
    return dataclasses.replace(
        config, rope_scaling=dict(config.rope_scaling) if config.rope_scaling else None
    )
