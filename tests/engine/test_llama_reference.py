"""SmolLM2-135M-Instruct: our model and tokenizer against transformers, from the same GGUF.

transformers dequantizes the GGUF and undoes llama.cpp's Q/K permutation with its own
code, so agreement here checks our loader, our layers and our tokenizer at once.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.models.loader import build_model
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.decode_loop import full_forward_logits, generate
from mini_vllm.tokenizer import IncrementalDetokenizer
from mini_vllm.weights.gguf_file import permute_rows

pytestmark = pytest.mark.real_weights

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "Grouped-query attention shares each key/value head among several query heads because",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm()).item()


def _reference_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0]


def test_tokenizer_and_chat_template_match_transformers(smollm2, hf_reference):
    _, tokenizer, _ = smollm2
    _, hf_tokenizer = hf_reference
    for text in PROMPTS + ["héllo wörld, 日本語 ✓  spaces\n\ttabs"]:
        assert tokenizer.encode(text) == hf_tokenizer.encode(text)
    ours = tokenizer.apply_chat_template(CHAT)
    assert ours == hf_tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id == 2


def test_logits_match_transformers(smollm2, hf_reference):
    model, tokenizer, _ = smollm2
    hf_model, _ = hf_reference
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT), add_special_tokens=False)
    worst = 0.0
    for ids in [tokenizer.encode(p) for p in PROMPTS] + [chat_ids]:
        err = rel_err(full_forward_logits(model, ids), _reference_logits(hf_model, ids))
        worst = max(worst, err)
        assert err < 1e-4, f"relative error {err:.2e} on {len(ids)} tokens"
    print(f"worst relative logits error: {worst:.2e}")


def test_greedy_32_tokens_match_transformers_generate(smollm2, hf_reference):
    model, tokenizer, config = smollm2
    hf_model, _ = hf_reference
    for prompt in PROMPTS[:3]:
        ids = tokenizer.encode(prompt)
        ours = generate(model, ids, SamplingParams(temperature=0.0, max_tokens=32)).token_ids
        with torch.inference_mode():
            out = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                pad_token_id=config.eos_token_ids[0],
            )
        theirs = out[0, len(ids) :].tolist()
        if 2 in theirs:  # transformers pads after EOS; we stop at it
            theirs = theirs[: theirs.index(2) + 1]
        assert ours == theirs, prompt


def test_instruct_model_knows_the_capital_of_france(smollm2):
    model, tokenizer, _ = smollm2
    ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT), add_special_tokens=False)
    result = generate(
        model, ids, SamplingParams(temperature=0.0, max_tokens=40), tokenizer=tokenizer
    )
    print(repr(result.text))
    assert "Paris" in result.text
    assert result.ttft_s > 0 and len(result.itl_s) == result.num_generated - 1


def test_streamed_text_equals_final_text(smollm2):
    model, tokenizer, _ = smollm2
    ids = tokenizer.encode("Write the word café three times, then 日本:")
    pieces: list[str] = []
    result = generate(
        model,
        ids,
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        tokenizer=tokenizer,
        on_token=lambda _tid, delta: pieces.append(delta),
    )
    assert "".join(pieces) == result.text
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.push(t) for t in tokenizer.encode("naïve 東京 🙂 ok"))
    assert text == "naïve 東京 🙂 ok"


def test_llamacpp_qk_permutation_on_the_real_weights(smollm2, hf_reference):
    """Why the loader un-permutes: on the real weights, llama.cpp's row order is exactly
    the interleaved-RoPE layout. Re-permuted rows + interleaved RoPE reproduce transformers;
    re-permuted rows + rotate-half RoPE (forgetting the fix) do not."""
    model, tokenizer, config = smollm2
    hf_model, _ = hf_reference
    gguf_rows = {}
    for name, t in model.hf_state_dict():
        if name.endswith("q_proj.weight"):
            t = permute_rows(t, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            t = permute_rows(t, config.num_key_value_heads)
        gguf_rows[name] = t
    ids = tokenizer.encode(PROMPTS[0])
    reference = _reference_logits(hf_model, ids)
    for neox, expect_match in [(False, True), (True, False)]:
        other = build_model(config, torch.device("cpu"), torch.float32, rope_is_neox_style=neox)
        other.load_weights(gguf_rows.items())
        other.process_weights_after_loading()
        err = rel_err(full_forward_logits(other, ids), reference)
        assert (err < 1e-4) == expect_match, f"neox={neox}: relative error {err:.2e}"
