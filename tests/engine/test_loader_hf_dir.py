"""Loading a Hugging Face model directory: transformers writes it, we read it, logits agree."""

from __future__ import annotations

import pytest
import torch

from mini_vllm.errors import UserError
from mini_vllm.models.loader import load_model
from mini_vllm.teaching.decode_loop import full_forward_logits
from mini_vllm.weights.hf_dir import read_hf_config


def _save_random_hf_llama(path, tie: bool, rope_scaling=None, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=5000.0,
        tie_word_embeddings=tie,
        rope_scaling=rope_scaling,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norm weights too, so a mix-up of the norms shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize(
    "tie, rope_scaling",
    [
        (True, None),
        (False, None),
        (
            False,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ],
    ids=["tied", "untied", "llama3-rope"],
)
def test_hf_directory_logits_match_transformers(tmp_path, tie, rope_scaling):
    reference = _save_random_hf_llama(tmp_path, tie, rope_scaling)
    model, tokenizer, config = load_model(str(tmp_path))
    assert tokenizer is None  # no tokenizer files were saved
    assert config.tie_word_embeddings == tie and config.num_key_value_heads == 2
    assert (config.rope_scaling is not None) == (rope_scaling is not None)
    ids = [1, 17, 250, 3, 99, 42, 7, 7, 120, 64, 5, 11, 200, 33, 2, 90, 18, 77, 60, 12]
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    ours = full_forward_logits(model, ids)
    err = ((ours - expected).norm() / expected.norm()).item()
    assert err < 1e-5, err


def test_hf_directory_errors(tmp_path):
    with pytest.raises(UserError, match="config.json"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(UserError, match="only Llama"):
        load_model(str(tmp_path))
