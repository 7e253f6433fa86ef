"""Phase 01 building blocks on the `tiny` shape (random weights, CPU, fast).

RMSNorm, RoPE, grouped-query attention and the KV cache are each checked against an
independent formula written here, not against our own code.
"""

from __future__ import annotations

import math

import pytest
import torch

from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.errors import UserError
from mini_vllm.layers.attention import Attention, attention_layers, bind_kv_caches
from mini_vllm.layers.layernorm import RMSNorm
from mini_vllm.layers.rotary_embedding import RotaryEmbedding
from mini_vllm.models.config import MODEL_CONFIGS, LlamaConfig, get_model_config
from mini_vllm.models.loader import build_model, load_model
from mini_vllm.teaching.decode_loop import full_forward_logits, run_model_step
from mini_vllm.weights.gguf_file import permute_rows, unpermute_rows


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---------------------------------------------------------------- configs


def test_named_configs_and_unknown_name():
    assert set(MODEL_CONFIGS) == {"tiny", "smollm2-135m", "llama-3.2-1b-like", "llama-3.1-8b-like"}
    tiny = get_model_config("tiny")
    assert tiny.num_attention_heads == 4 and tiny.num_key_value_heads == 2  # GQA groups of 2
    smol = get_model_config("smollm2-135m")
    assert (
        smol.num_hidden_layers,
        smol.hidden_size,
        smol.num_attention_heads,
        smol.num_key_value_heads,
        smol.head_dim,
        smol.intermediate_size,
        smol.vocab_size,
    ) == (30, 576, 9, 3, 64, 1536, 49152)
    assert smol.num_parameters() == 134_515_008  # SmolLM2-135M's published count
    big = get_model_config("llama-3.2-1b-like")
    assert (
        big.hidden_size,
        big.num_hidden_layers,
        big.num_attention_heads,
        big.num_key_value_heads,
        big.head_dim,
        big.intermediate_size,
        big.vocab_size,
        big.tie_word_embeddings,
        big.rope_theta,
    ) == (2048, 16, 32, 8, 64, 8192, 128256, True, 500000.0)
    with pytest.raises(UserError, match="tiny, smollm2-135m, llama-3.2-1b-like"):
        get_model_config("gpt-5")
    with pytest.raises(UserError, match="multiple"):
        LlamaConfig(
            vocab_size=10,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=3,
            num_key_value_heads=2,
            head_dim=4,
        )


def test_load_model_names_and_errors():
    with pytest.raises(UserError) as info:
        load_model("no-such-model")
    message = str(info.value)
    for name in (
        "smollm2-135m-instruct",
        "tiny",
        "smollm2-135m",
        "llama-3.2-1b-like",
        "Hugging Face model directory",
    ):
        assert name in message
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            load_model("tiny", device="cuda")


def test_random_init_is_a_function_of_the_seed():
    a, _, _ = load_model("tiny", seed=3)
    b, _, _ = load_model("tiny", seed=3)
    c, _, _ = load_model("tiny", seed=4)
    for (name, pa), (_, pb), (_, pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters()
    ):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_random_init_is_the_same_on_any_thread_count_layout_and_dtype(monkeypatch):
    """Blocks are seeded by parameter and position, so neither the threads that draw them
    nor the device's layout (CPU weights are stored transposed) nor the dtype changes a
    number; and no two layers get the same matrix."""
    from mini_vllm.models import loader

    monkeypatch.setattr(loader, "RANDOM_INIT_BLOCK", 1000)  # several blocks a matrix
    config = loader.get_model_config("tiny")
    models = []
    for threads, dtype, device in ((1, torch.float32, "cpu"), (3, torch.float32, "cpu"),
                                   (2, torch.bfloat16, "cpu")):  # fmt: skip
        model = loader.build_model(config, torch.device(device), dtype)
        loader.random_init(model, seed=5, threads=threads)
        models.append(dict(model.named_parameters()))
    one, three, bf16 = models
    assert not one["model.layers.0.mlp.down_proj.weight"].is_contiguous()  # the CPU layout
    for name, param in one.items():
        assert torch.equal(param, three[name]), name
        assert torch.equal(param.to(torch.bfloat16), bf16[name]), name
    first, second = (one[f"model.layers.{i}.self_attn.qkv_proj.weight"] for i in (0, 1))
    assert not torch.equal(first, second)
    std = config.initializer_range
    assert abs(float(first.std()) - std) < 0.1 * std


# ---------------------------------------------------------------- shapes


def test_forward_shapes_flattened_batch(tiny):
    model, _, config = tiny
    # Two sequences of 5 tokens laid end to end: no batch dimension anywhere.
    ids = torch.randint(0, config.vocab_size, (10,))
    caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        2,
        5,
        config.num_key_value_heads,
        config.head_dim,
        torch.float32,
        "cpu",
    )
    bind_kv_caches(model, ContiguousAttentionBackend(), caches)
    try:
        from mini_vllm.forward_context import set_forward_context

        with (
            torch.inference_mode(),
            set_forward_context(None, attn_metadata=ContiguousAttentionMetadata.prefill(2, 5)),
        ):
            hidden = model(ids, torch.arange(5).repeat(2))
            assert hidden.shape == (10, config.hidden_size)
            logits = model.compute_logits(hidden[[4, 9]])
            assert logits.shape == (2, config.vocab_size)
    finally:
        bind_kv_caches(model, None, None)
    assert [layer.layer_idx for layer in attention_layers(model)] == list(
        range(config.num_hidden_layers)
    )


def test_attention_without_backend_says_what_to_do():
    layer = Attention(0, 4, 2, 8, 8**-0.5)
    with pytest.raises(RuntimeError, match="bind_kv_caches"):
        layer(torch.zeros(1, 32), torch.zeros(1, 16), torch.zeros(1, 16))


def test_attention_without_metadata_says_what_to_do_and_a_dummy_run_writes_zeros():
    from mini_vllm.forward_context import set_forward_context

    layer = Attention(0, 4, 2, 8, 8**-0.5)
    caches = allocate_contiguous_kv_caches(1, 1, 4, 2, 8, torch.float32, "cpu")
    layer.impl, layer.kv_cache = ContiguousAttentionBackend(), caches[0]
    q, k, v = torch.randn(3, 32), torch.randn(3, 16), torch.randn(3, 16)
    with torch.inference_mode():
        with set_forward_context(None), pytest.raises(RuntimeError, match="attn_metadata="):
            layer(q, k, v)
        output = torch.full((3, 32), float("nan"))
        with set_forward_context(None, skip_attention=True):
            assert layer(q, k, v, output) is output
            assert torch.equal(layer(q, k, v), torch.zeros(3, 32))
        assert torch.equal(output, torch.zeros(3, 32))
        assert torch.count_nonzero(caches[0]) == 0  # a dummy run writes no key or value


# ---------------------------------------------------------------- RMSNorm


def test_rmsnorm_formula_and_fused_residual():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    norm.weight.data = torch.rand(16) + 0.5
    x, r = torch.randn(3, 16), torch.randn(3, 16)
    expected = (
        x.double()
        / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
        * norm.weight.double()
    )
    assert torch.allclose(norm(x).double(), expected, atol=1e-6)
    out, new_residual = norm(x, r)
    assert torch.equal(new_residual, x + r)  # the residual stream carries the sum on
    assert torch.allclose(out, norm(x + r), atol=1e-7)


# ---------------------------------------------------------------- RoPE


def _rope_by_complex_numbers(
    x: torch.Tensor, positions: torch.Tensor, base: float, neox: bool
) -> torch.Tensor:
    """Independent reference in float64: each channel
    pair is a complex number times e^{i m theta}."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None, None] * theta  # [T, 1, d/2]
    x = x.double()
    if neox:
        z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
        z = z * torch.polar(torch.ones_like(angle), angle)
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(angle), angle)
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)


@pytest.mark.parametrize("neox", [True, False])
def test_rope_matches_complex_rotation(neox):
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16, max_position=512, base=10000.0, is_neox_style=neox)
    positions = torch.tensor([0, 1, 7, 100, 511])
    q, k = torch.randn(5, 4 * 16), torch.randn(5, 2 * 16)
    q_rot, k_rot = rope(positions, q, k)
    assert torch.allclose(
        q_rot.view(5, 4, 16).double(),
        _rope_by_complex_numbers(q.view(5, 4, 16), positions, 1e4, neox),
        atol=1e-5,
    )
    assert torch.allclose(
        k_rot.view(5, 2, 16).double(),
        _rope_by_complex_numbers(k.view(5, 2, 16), positions, 1e4, neox),
        atol=1e-5,
    )
    assert torch.equal(q_rot[0], q[0])  # position 0 is no rotation at all


def test_rope_scores_depend_only_on_position_difference():
    torch.manual_seed(1)
    rope = RotaryEmbedding(head_dim=16, max_position=1024, base=10000.0)
    q, k = torch.randn(1, 16), torch.randn(1, 16)

    def score(m: int, n: int) -> float:
        qm, _ = rope(torch.tensor([m]), q, k)
        _, kn = rope(torch.tensor([n]), q, k)
        return (qm * kn).sum().item()

    for m, n in [(5, 2), (40, 0), (3, 9)]:
        for shift in (1, 17, 300):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-4, abs=1e-5)
    assert score(9, 2) != pytest.approx(score(5, 2), rel=1e-3)  # but the difference itself matters


# ---------------------------------------------------------------- GQA + KV cache


def _naive_attention(q, k, v, q_positions, scale):
    """q [S, H, D], k/v [L, Hkv, D]: copy each KV head
    to its query heads (repeat_kv), mask, softmax."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("shd,lhd->hsl", q.double(), k.double()) * scale
    visible = torch.arange(k.shape[0])[None, :] <= q_positions[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hsl,lhd->shd", scores.softmax(-1), v.double())


def test_gqa_backend_equals_explicit_repeat_kv():
    torch.manual_seed(0)
    batch, prompt, heads, kv_heads, dim = 2, 6, 8, 2, 16
    backend = ContiguousAttentionBackend()
    cache = torch.zeros(2, batch, prompt + 3, kv_heads, dim)
    scale = dim**-0.5
    all_q, all_k, all_v = [], [], []
    # Prefill both sequences, then three decode steps; compare every output.
    for step, (start, new) in enumerate(
        [(0, prompt), (prompt, 1), (prompt + 1, 1), (prompt + 2, 1)]
    ):
        q = torch.randn(batch * new, heads, dim)
        k = torch.randn(batch * new, kv_heads, dim)
        v = torch.randn(batch * new, kv_heads, dim)
        out = backend.forward(q, k, v, cache, ContiguousAttentionMetadata(batch, start, new))
        assert out.shape == (batch * new, heads, dim)
        all_q.append(q.view(batch, new, heads, dim))
        all_k.append(k.view(batch, new, kv_heads, dim))
        all_v.append(v.view(batch, new, kv_heads, dim))
        keys, values = torch.cat(all_k, 1), torch.cat(all_v, 1)
        for b in range(batch):
            expected = _naive_attention(
                all_q[-1][b], keys[b], values[b], torch.arange(start, start + new), scale
            )
            assert torch.allclose(
                out.view(batch, new, heads, dim)[b].double(), expected, atol=1e-5
            ), (step, b)
    # The cache holds exactly what was written, where it was written.
    assert torch.equal(cache[0], torch.cat(all_k, 1)) and torch.equal(cache[1], torch.cat(all_v, 1))


def test_decode_with_cache_equals_full_recompute_every_step(tiny):
    model, _, config = tiny
    prompt = [256, 72, 101, 108, 108, 111, 44, 32]
    steps = 10
    tokens = list(prompt)
    caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        1,
        len(prompt) + steps,
        config.num_key_value_heads,
        config.head_dim,
        torch.float32,
        "cpu",
    )
    step_logits = []
    bind_kv_caches(model, ContiguousAttentionBackend(), caches)
    try:
        with torch.inference_mode():
            logits = run_model_step(
                model,
                torch.tensor(prompt),
                torch.arange(len(prompt)),
                ContiguousAttentionMetadata.prefill(1, len(prompt)),
                torch.tensor([len(prompt) - 1]),
            )
            for _ in range(steps):
                step_logits.append(logits[0].clone())
                tokens.append(int(logits[0].argmax()))
                pos = len(tokens) - 1
                logits = run_model_step(
                    model,
                    torch.tensor([tokens[-1]]),
                    torch.tensor([pos]),
                    ContiguousAttentionMetadata.decode(1, pos),
                )
    finally:
        bind_kv_caches(model, None, None)
    for i, cached in enumerate(step_logits):
        prefix = tokens[: len(prompt) + i]
        recomputed = full_forward_logits(model, prefix)[-1]
        assert rel_err(cached, recomputed) < 1e-5, f"step {i}"


# ---------------------------------------------------------------- llama.cpp layout


def test_llamacpp_permutation_is_the_rope_layout_change(tiny):
    model, _, config = tiny
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)  # 2 heads of 8 rows
    permuted = permute_rows(w, num_heads=2)
    # Row `half * 4 + i` of a head moves to row `2 * i + half`.
    assert (
        torch.equal(permuted[2], w[1])
        and torch.equal(permuted[1], w[4])
        and torch.equal(permuted[9], w[12])
    )
    assert torch.equal(unpermute_rows(permuted, 2), w)

    def with_rows(neox: bool, permute: bool):
        other = build_model(config, torch.device("cpu"), torch.float32, rope_is_neox_style=neox)
        weights = {}
        for name, t in model.hf_state_dict():
            if permute and name.endswith("q_proj.weight"):
                t = permute_rows(t, config.num_attention_heads)
            elif permute and name.endswith("k_proj.weight"):
                t = permute_rows(t, config.num_key_value_heads)
            weights[name] = t
        other.load_weights(weights.items())
        other.process_weights_after_loading()
        return other

    ids = [256, 10, 20, 30, 40, 50, 60]
    reference = full_forward_logits(model, ids)
    # llama.cpp's rows with llama.cpp's (interleaved) RoPE: the same model.
    assert rel_err(full_forward_logits(with_rows(neox=False, permute=True), ids), reference) < 1e-5
    # llama.cpp's rows with Hugging Face's rotate-half RoPE: a different model.
    assert rel_err(full_forward_logits(with_rows(neox=True, permute=True), ids), reference) > 1e-3


def test_hf_state_dict_round_trip_and_load_errors(tiny):
    model, _, config = tiny
    copy = build_model(config, torch.device("cpu"), torch.float32)
    copy.load_weights(model.hf_state_dict())
    copy.process_weights_after_loading()
    ids = [1, 2, 3, 4]
    assert torch.equal(full_forward_logits(copy, ids), full_forward_logits(model, ids))
    weights = dict(model.hf_state_dict())
    with pytest.raises(ValueError, match="missing"):
        build_model(config, torch.device("cpu"), torch.float32).load_weights(
            (n, t) for n, t in weights.items() if "layers.1.mlp.up_proj" not in n
        )
    with pytest.raises(ValueError, match="no place"):
        build_model(config, torch.device("cpu"), torch.float32).load_weights(
            [*weights.items(), ("model.layers.9.self_attn.q_proj.weight", torch.zeros(1))]
        )
    with pytest.raises(ValueError, match="shape"):
        build_model(config, torch.device("cpu"), torch.float32).load_weights(
            [("model.layers.0.self_attn.k_proj.weight", torch.zeros(3, 3))]
        )


def test_cpu_weights_are_laid_out_for_matrix_vector_products(tiny):
    model, _, _ = tiny
    layer = model.model.layers[0]
    # Every matrix is column-major on CPU (wide and narrow alike); logical shapes are unchanged.
    for weight in (
        layer.mlp.gate_up_proj.weight,
        layer.mlp.down_proj.weight,
        layer.self_attn.qkv_proj.weight,
    ):
        assert weight.stride() == (1, weight.shape[0])
    # The tied head got its own column-major copy with the embedding's values.
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert (
        not model.lm_head.weight.is_contiguous() and model.model.embed_tokens.weight.is_contiguous()
    )
    assert math.isclose(model.config.head_dim**-0.5, layer.self_attn.attn.scale)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("parts", [2, 3])
def test_split_k_linear_equals_one_product(rows, parts):
    from mini_vllm.kernels.cpu import column_major, split_k_linear, weight_slices

    generator = torch.Generator().manual_seed(rows * 10 + parts)
    weight = column_major(torch.randn(40, 24, generator=generator))
    x = torch.randn(rows, 24, generator=generator)
    slices = weight_slices(weight, parts)
    assert slices.data_ptr() == weight.data_ptr()  # a view: no second copy of the weight
    torch.testing.assert_close(split_k_linear(x, slices), x @ weight.t(), rtol=1e-5, atol=1e-5)


def test_cpu_linear_splits_only_small_batches_over_several_threads(monkeypatch):
    from mini_vllm.kernels import cpu
    from mini_vllm.layers.linear import ReplicatedLinear

    calls = []
    real = cpu.split_k_linear
    monkeypatch.setattr(cpu, "split_k_linear", lambda x, s: calls.append(s.shape[0]) or real(x, s))
    layer = ReplicatedLinear(8, 16)  # on the CPU, with the kernels on, its weight is column-major
    layer.weight.data.copy_(torch.randn(16, 8))
    weight = layer.weight.data
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        layer(torch.randn(1, 8))  # decode: split over the 2 threads
        layer(torch.randn(cpu.SPLIT_K_MAX_ROWS + 1, 8))  # prefill: one product
        x = torch.randn(1, 8)
        torch.testing.assert_close(layer(x), x @ weight.t())
        assert layer.weight._split_k_slices[1].data_ptr() == weight.data_ptr()  # a view, no copy
        other = cpu.column_major(torch.randn(16, 8))
        layer.weight.data = other  # a loader swapped the weight's data: the kept view must follow
        torch.testing.assert_close(layer(x), x @ other.t())
        assert layer.weight._split_k_slices[1].data_ptr() == other.data_ptr()
        layer.weight.data = other.contiguous()  # row-major: one product
        layer(torch.randn(1, 8))
        layer.weight.data = other
        torch.set_num_threads(1)
        layer(torch.randn(1, 8))  # one thread: nothing to split over
    finally:
        torch.set_num_threads(previous)
    assert calls == [2, 2, 2]
