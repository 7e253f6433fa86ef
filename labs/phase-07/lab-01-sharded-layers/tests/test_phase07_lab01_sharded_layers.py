"""Phase 07, lab 01 — sharded linear layers: two ranks together compute the whole layer.

Loading is checked in this process, as each rank would see it (a tensor-parallel group of
the right size and rank patched in, no collective needed). Forwards run on two real ranks:
two processes joined by gloo, each building its shard of the same layer and comparing its
output with the whole layer's, computed in the same process. A rank's failed assertion
fails the test with that rank's traceback.

Shapes are tiny and one process group serves a whole test, so the lab runs in seconds.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import pytest
import torch
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from torch.testing import assert_close

import mini_vllm.layers.linear as reference
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    patch_tensor_parallel_group,
)
from mini_vllm.errors import UserError

impl = implementation(__file__, starter="parallel_linear.py", reference="mini_vllm.layers.linear")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase07_lab01_answers"
)

# Forked ranks share this process's modules (your starter as loaded here); where fork is
# missing (Windows) or unsafe with torch (macOS), each rank starts afresh.
START = "fork" if sys.platform == "linux" else "spawn"


# --- helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
def as_rank(rank: int, tp: int = 2):
    """Build and load as rank `rank` of `tp` would (collectives are not available here)."""
    with patch_tensor_parallel_group(GroupCoordinator(f"tp:lab{tp}", tp, rank)):
        yield


def whole(make):
    """The layer as one rank builds it: the whole matrix."""
    with patch_tensor_parallel_group(GroupCoordinator.single()):
        return make()


def load(layer, tensor, shard_id=None):
    layer.weight.weight_loader(layer.weight, tensor, shard_id)
    return layer


def weights(seed: int, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _rank_entry(rank: int, init_file: str, out_dir: str, fn, args) -> None:
    torch.set_num_threads(1)  # two ranks share the cores
    init_distributed_environment(2, rank, f"file://{init_file}", "gloo", 30)
    initialize_model_parallel(2)
    try:
        result = fn(rank, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_distributed_environment()


def on_two_ranks(fn, *args) -> list:
    """Run `fn(rank, *args)` on two gloo ranks, one process each; their return values."""
    with tempfile.TemporaryDirectory() as tmp:
        torch_mp.start_processes(
            _rank_entry,
            args=(os.path.join(tmp, "rendezvous"), tmp, fn, args),
            nprocs=2,
            join=True,
            start_method=START,
        )
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]


def count_all_reduces() -> list:
    """Count the all-reduces of this rank's group from now on."""
    group, calls = get_tp_group(), []
    plain = group.all_reduce

    def counted(x):
        calls.append(tuple(x.shape))
        return plain(x)

    group.all_reduce = counted
    return calls


# --- the README's scenarios, built on the reference for the prediction tests --------------


def _bitwise_on_reference(rank: int) -> dict:
    x = weights(1, 8, 96)
    w = weights(2, 64, 96)
    col = load(reference.ColumnParallelLinear(96, 64), w)
    col_whole = load(whole(lambda: reference.ColumnParallelLinear(96, 64)), w)
    row = load(reference.RowParallelLinear(96, 64), w)
    row_whole = load(whole(lambda: reference.RowParallelLinear(96, 64)), w)
    mine, outs = slice(48 * rank, 48 * (rank + 1)), slice(32 * rank, 32 * (rank + 1))
    return {
        "column": bool(torch.equal(col(x), col_whole(x)[:, outs])),
        "row": bool(torch.equal(row(x[:, mine].contiguous()), row_whole(x))),
        "row_close": bool(
            torch.allclose(row(x[:, mine].contiguous()), row_whole(x), atol=1e-4, rtol=0)
        ),
    }


# --- step 1: a rank's shard of the weights ------------------------------------------------


@pytest.mark.step1
def test_a_split_that_does_not_divide_evenly_is_refused_with_the_size():
    with as_rank(0, tp=4):
        with pytest.raises(UserError, match="10"):
            impl.ColumnParallelLinear(16, 10)
        with pytest.raises(UserError, match="6"):
            impl.RowParallelLinear(6, 16)
    with as_rank(1, tp=2):
        assert impl.ColumnParallelLinear(16, 10).weight.shape == (5, 16)
        assert impl.RowParallelLinear(6, 16).weight.shape == (16, 3)


@pytest.mark.step1
def test_a_column_parallel_rank_holds_the_rows_of_its_outputs():
    w = weights(0, 12, 16)
    for rank in range(2):
        with as_rank(rank):
            layer = load(impl.ColumnParallelLinear(16, 12), w)
        assert_close(layer.weight.data, w[6 * rank : 6 * rank + 6], atol=0, rtol=0)


@pytest.mark.step1
def test_a_square_column_parallel_weight_is_still_split_by_output_rows():
    """Your decision: which block of the whole weight a column-parallel rank keeps."""
    w = weights(1, 8, 8)
    for rank in range(2):
        with as_rank(rank):
            layer = load(impl.ColumnParallelLinear(8, 8), w)
        assert torch.equal(layer.weight.data, w[4 * rank : 4 * rank + 4]), (
            f"rank {rank} of a column-parallel layer must compute outputs "
            f"{4 * rank}..{4 * rank + 3}, and output j of x W^T is computed by row j of W "
            "(weights are [out, in]): it keeps those ROWS of the whole weight"
        )


@pytest.mark.step1
def test_a_row_parallel_rank_holds_the_columns_that_meet_its_input_slice():
    w = weights(2, 16, 12)
    for rank in range(2):
        with as_rank(rank):
            layer = load(impl.RowParallelLinear(12, 16), w)
        assert torch.equal(layer.weight.data, w[:, 6 * rank : 6 * rank + 6]), (
            f"rank {rank} of a row-parallel layer receives input features "
            f"{6 * rank}..{6 * rank + 5}; in x W^T they multiply COLUMNS of W"
        )


@pytest.mark.step1
@pytest.mark.parametrize("kind", ["column", "row"])
def test_the_shards_of_four_ranks_tile_the_whole_weight(kind):
    w = weights(3, 8, 8)
    shards = []
    for rank in range(4):
        with as_rank(rank, tp=4):
            make = impl.ColumnParallelLinear if kind == "column" else impl.RowParallelLinear
            shards.append(load(make(8, 8), w).weight.data)
    assert torch.equal(torch.cat(shards, dim=0 if kind == "column" else 1), w)


@pytest.mark.step1
def test_one_rank_holds_the_whole_weight():
    w = weights(4, 12, 16)
    assert torch.equal(load(whole(lambda: impl.ColumnParallelLinear(16, 12)), w).weight, w)
    assert torch.equal(load(whole(lambda: impl.RowParallelLinear(16, 12)), w).weight, w)


@pytest.mark.step1
@pytest.mark.parametrize("kind", ["column", "row"])
def test_loading_keeps_the_layers_dtype_and_its_own_copy(kind):
    w = weights(5, 8, 8, dtype=torch.bfloat16)
    before = w.clone()
    with as_rank(1):
        make = impl.ColumnParallelLinear if kind == "column" else impl.RowParallelLinear
        layer = load(make(8, 8), w)
    assert layer.weight.dtype == torch.float32, "a bfloat16 checkpoint changed the layer's dtype"
    assert torch.equal(w, before), "loading changed the caller's checkpoint tensor"
    kept = layer.weight.data.clone()
    w.add_(1.0)
    assert torch.equal(layer.weight.data, kept), (
        "the layer's weight shares memory with the checkpoint tensor"
    )


@pytest.mark.step1
def test_a_checkpoint_tensor_of_the_wrong_shape_is_refused():
    with as_rank(0):
        with pytest.raises(UserError):
            load(impl.ColumnParallelLinear(16, 12), weights(6, 12, 15))
        with pytest.raises(UserError):
            load(impl.RowParallelLinear(12, 16), weights(6, 15, 12))


# --- step 2: the forwards, on two ranks ---------------------------------------------------


def _column_outputs(rank: int) -> None:
    x, w = weights(10, 5, 16), weights(11, 12, 16)
    expected = load(whole(lambda: impl.ColumnParallelLinear(16, 12)), w)(x)
    before = x.clone()
    calls = count_all_reduces()
    out = load(impl.ColumnParallelLinear(16, 12), w)(x)
    assert out.shape == (5, 6), f"rank {rank}: shape {tuple(out.shape)}, not its 6 outputs"
    assert_close(out, expected[:, 6 * rank : 6 * rank + 6])
    assert not calls, "a column-parallel layer's outputs are complete on each rank: no sum"
    assert torch.equal(x, before)


def _gathered_outputs(rank: int) -> None:
    x, w = weights(12, 5, 16), weights(13, 12, 16)
    expected = load(whole(lambda: impl.ColumnParallelLinear(16, 12)), w)(x)
    out = load(impl.ColumnParallelLinear(16, 12, gather_output=True), w)(x)
    assert out.shape == (5, 12), f"rank {rank}: gather_output gave shape {tuple(out.shape)}"
    assert_close(out, expected)


def _row_outputs(rank: int, reduce_results: bool) -> None:
    x, w = weights(14, 5, 12), weights(15, 16, 12)
    expected = load(whole(lambda: impl.RowParallelLinear(12, 16)), w)(x)
    mine = x[:, 6 * rank : 6 * rank + 6].clone()
    before = mine.clone()
    out = load(impl.RowParallelLinear(12, 16, reduce_results=reduce_results), w)(mine)
    assert torch.equal(mine, before), "the forward changed its input"
    if reduce_results:
        assert_close(out, expected, atol=1e-5, rtol=0)
    else:
        # This rank's own contribution: its input slice times its block of the weight.
        assert_close(out, mine @ w[:, 6 * rank : 6 * rank + 6].T)
    return out


def _mlp_without_gate(rank: int) -> None:
    x = weights(16, 5, 16)
    w_up, w_down = weights(17, 24, 16), weights(18, 16, 24)
    up = load(whole(lambda: impl.ColumnParallelLinear(16, 24)), w_up)
    down = load(whole(lambda: impl.RowParallelLinear(24, 16)), w_down)
    expected = down(F.gelu(up(x)))
    up = load(impl.ColumnParallelLinear(16, 24), w_up)
    down = load(impl.RowParallelLinear(24, 16), w_down)
    calls = count_all_reduces()
    assert_close(down(F.gelu(up(x))), expected, atol=1e-5, rtol=0)
    assert len(calls) == 1, f"rank {rank}: {len(calls)} all-reduces for one column-row pair"


def _float64_forward(rank: int) -> None:
    x, w = weights(19, 5, 8, dtype=torch.float64), weights(20, 8, 8, dtype=torch.float64)
    col = load(impl.ColumnParallelLinear(8, 8, gather_output=True).double(), w)
    row = load(impl.RowParallelLinear(8, 8).double(), w)
    assert col.weight.dtype == torch.float64
    assert col(x).dtype == torch.float64, "the column-parallel output changed dtype"
    out = row(x[:, 4 * rank : 4 * rank + 4])
    assert out.dtype == torch.float64, "the row-parallel output changed dtype"
    assert_close(out, x @ w.T)


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    results = on_two_ranks(_bitwise_on_reference)
    check_predictions(
        answers,
        {
            "COLUMN_TP2_BITWISE_EQUAL": all(r["column"] for r in results),
            "ROW_TP2_BITWISE_EQUAL": all(r["row"] for r in results),
            "ROW_TP2_WITHIN_1E_4": all(r["row_close"] for r in results),
        },
    )


@pytest.mark.step2
def test_one_rank_layers_compute_the_plain_product():
    x, w = weights(21, 5, 16), weights(22, 12, 16)
    for make in (
        lambda: impl.ColumnParallelLinear(16, 12),
        lambda: impl.ColumnParallelLinear(16, 12, gather_output=True),
    ):
        assert_close(load(whole(make), w)(x), x @ w.T)
    w = weights(23, 16, 12)
    assert_close(load(whole(lambda: impl.RowParallelLinear(12, 16)), w)(x[:, :12]), x[:, :12] @ w.T)


@pytest.mark.step2
def test_a_column_parallel_rank_returns_its_slice_of_the_outputs_without_communicating():
    on_two_ranks(_column_outputs)


@pytest.mark.step2
def test_gather_output_gives_every_rank_the_whole_output():
    on_two_ranks(_gathered_outputs)


@pytest.mark.step2
def test_row_parallel_ranks_together_give_the_whole_output():
    outs = on_two_ranks(_row_outputs, True)
    assert torch.equal(outs[0], outs[1]), "the two ranks returned different outputs"


@pytest.mark.step2
def test_without_reduce_results_a_rank_returns_only_its_own_contribution():
    outs = on_two_ranks(_row_outputs, False)
    assert not torch.equal(outs[0], outs[1])


@pytest.mark.step2
def test_a_column_then_row_pair_needs_one_all_reduce_and_equals_the_whole_pair():
    on_two_ranks(_mlp_without_gate)


@pytest.mark.step2
def test_the_forwards_keep_the_inputs_dtype():
    on_two_ranks(_float64_forward)


# --- step 3: gate and up in one layer ------------------------------------------------------


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _swiglu_mlp(rank: int) -> None:
    x = weights(30, 5, 16)
    gate, up, down = weights(31, 8, 16), weights(32, 8, 16), weights(33, 16, 8)
    layers = []
    for build in (whole, lambda make: make()):
        gate_up = build(lambda: impl.MergedColumnParallelLinear(16, [8, 8]))
        load(gate_up, gate, 0)
        load(gate_up, up, 1)
        layers.append((gate_up, load(build(lambda: impl.RowParallelLinear(8, 16)), down)))
    expected = layers[0][1](swiglu(layers[0][0](x)))
    assert_close(layers[1][1](swiglu(layers[1][0](x))), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.step3
def test_a_ranks_merged_weight_is_its_gate_rows_then_the_same_up_rows():
    """Your decision: how a rank's slice of the merged gate/up weight is laid out."""
    gate, up = weights(34, 8, 16), weights(35, 8, 16)
    for rank in range(2):
        with as_rank(rank):
            layer = impl.MergedColumnParallelLinear(16, [8, 8])
        load(layer, gate, 0)
        load(layer, up, 1)
        mine = slice(4 * rank, 4 * rank + 4)
        expected = torch.cat([gate[mine], up[mine]])
        assert torch.equal(layer.weight.data, expected), (
            f"rank {rank} applies SwiGLU to its own outputs, first half gate, second half up, "
            "element by element: its rows must be [its gate rows | the SAME features' up rows]"
            ", not its block of the stacked [gate; up] matrix (that gives rank 0 only gate)"
        )


@pytest.mark.step3
def test_projections_of_different_sizes_each_split_over_the_ranks():
    a, b = weights(36, 8, 16), weights(37, 4, 16)
    for rank in range(2):
        with as_rank(rank):
            layer = impl.MergedColumnParallelLinear(16, [8, 4])
        load(layer, a, 0)
        load(layer, b, 1)
        expected = torch.cat([a[4 * rank : 4 * rank + 4], b[2 * rank : 2 * rank + 2]])
        assert torch.equal(layer.weight.data, expected)


@pytest.mark.step3
def test_one_rank_merged_weight_is_gate_stacked_on_up():
    gate, up = weights(38, 8, 16), weights(39, 8, 16)
    layer = whole(lambda: impl.MergedColumnParallelLinear(16, [8, 8]))
    load(layer, up, 1)  # the checkpoint's order is not the layer's
    load(layer, gate, 0)
    assert torch.equal(layer.weight.data, torch.cat([gate, up]))


@pytest.mark.step3
def test_merged_loading_leaves_the_checkpoint_alone_and_refuses_bad_shards():
    gate = weights(40, 8, 16, dtype=torch.bfloat16)
    before = gate.clone()
    with as_rank(1):
        layer = impl.MergedColumnParallelLinear(16, [8, 8])
    load(layer, gate, 0)
    assert torch.equal(gate, before), "loading changed the caller's checkpoint tensor"
    assert layer.weight.dtype == torch.float32
    for bad in (2, -1, "gate", None):
        with pytest.raises(ValueError):
            load(layer, gate, bad)
    with pytest.raises(UserError):
        load(layer, weights(41, 8, 15), 1)


@pytest.mark.step3
def test_a_swiglu_mlp_on_two_ranks_equals_the_whole_mlp():
    on_two_ranks(_swiglu_mlp)


# --- step 4: q, k and v, by heads ----------------------------------------------------------


def qkv_weights(seed: int, heads: int, kv_heads: int, head_size: int = 2, hidden: int = 16):
    return {
        "q": weights(seed, heads * head_size, hidden),
        "k": weights(seed + 1, kv_heads * head_size, hidden),
        "v": weights(seed + 2, kv_heads * head_size, hidden),
    }


def load_qkv(layer, ws):
    for shard_id in ("v", "q", "k"):  # any order
        load(layer, ws[shard_id], shard_id)
    return layer


def heads_rows(w: torch.Tensor, heads, head_size: int = 2) -> torch.Tensor:
    return torch.cat([w[h * head_size : (h + 1) * head_size] for h in heads])


def expected_qkv(ws, rank, tp, heads, kv_heads, head_size=2):
    per_rank = heads // tp
    q_heads = range(rank * per_rank, (rank + 1) * per_rank)
    group = heads // kv_heads
    kv = sorted({h // group for h in q_heads})
    return torch.cat(
        [heads_rows(ws["q"], q_heads, head_size)]
        + [heads_rows(ws[s], kv, head_size) for s in ("k", "v")]
    )


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    with as_rank(1):
        layer = reference.QKVParallelLinear(64, 16, 4, 1)
    qkv_bytes = layer.weight.numel() * layer.weight.element_size()
    marked = torch.arange(2).repeat_interleave(4)[:, None].expand(8, 16).float()  # row: head id
    with as_rank(3, tp=4):
        layer = reference.QKVParallelLinear(16, 4, 8, 2)
    load(layer, marked, "k")
    kv_head = int(layer.weight.data[layer.q_size, 0])
    check_predictions(answers, {"QKV_BYTES_PER_RANK": qkv_bytes, "KV_HEAD_OF_RANK_3": kv_head})


@pytest.mark.step4
@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(4, 2, 2), (4, 4, 2), (8, 4, 4)])
def test_kv_heads_split_like_the_query_heads_when_there_are_enough(heads, kv_heads, tp):
    ws = qkv_weights(50, heads, kv_heads)
    for rank in range(tp):
        with as_rank(rank, tp):
            layer = load_qkv(impl.QKVParallelLinear(16, 2, heads, kv_heads), ws)
        assert torch.equal(layer.weight.data, expected_qkv(ws, rank, tp, heads, kv_heads))


@pytest.mark.step4
@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(4, 1, 2), (8, 2, 4), (4, 2, 4)])
def test_a_rank_keeps_the_kv_head_its_query_heads_read_when_kv_heads_are_replicated(
    heads, kv_heads, tp
):
    ws = qkv_weights(60, heads, kv_heads)
    for rank in range(tp):
        with as_rank(rank, tp):
            layer = load_qkv(impl.QKVParallelLinear(16, 2, heads, kv_heads), ws)
        assert torch.equal(layer.weight.data, expected_qkv(ws, rank, tp, heads, kv_heads)), (
            f"rank {rank} of {tp}: its query heads read KV head "
            f"{(rank * heads // tp) // (heads // kv_heads)} (grouped-query attention); "
            "that is the one it must hold"
        )


@pytest.mark.step4
def test_one_rank_qkv_weight_is_q_then_k_then_v():
    ws = qkv_weights(70, 4, 2)
    layer = load_qkv(whole(lambda: impl.QKVParallelLinear(16, 2, 4, 2)), ws)
    assert torch.equal(layer.weight.data, torch.cat([ws["q"], ws["k"], ws["v"]]))


@pytest.mark.step4
def test_qkv_loading_leaves_the_checkpoint_alone_and_refuses_bad_shards():
    ws = qkv_weights(80, 4, 2)
    before = {k: v.clone() for k, v in ws.items()}
    with as_rank(1):
        layer = load_qkv(impl.QKVParallelLinear(16, 2, 4, 2), ws)
    assert all(torch.equal(ws[k], before[k]) for k in ws), "loading changed a checkpoint tensor"
    for bad in ("o", 0, None, "Q"):
        with pytest.raises(ValueError):
            load(layer, ws["q"], bad)
    with pytest.raises(UserError):
        load(layer, weights(81, 4, 15), "k")  # rows of 15 inputs, the layer has 16


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def llama_layer(x, qkv, o_proj, gate_up, down, heads: int, kv_heads: int, head_size: int):
    """A Llama decoder layer without RoPE: attention then SwiGLU MLP, each with a residual.
    `heads` and `kv_heads` are the ones this rank holds."""
    tokens = x.shape[0]
    q, k, v = qkv(rms_norm(x)).split(
        [heads * head_size, kv_heads * head_size, kv_heads * head_size], -1
    )
    q = q.view(tokens, heads, head_size).transpose(0, 1)
    k = k.view(tokens, kv_heads, head_size).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
    v = v.view(tokens, kv_heads, head_size).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = x + o_proj(attn.transpose(0, 1).reshape(tokens, heads * head_size))
    return h + down(swiglu(gate_up(rms_norm(h))))


def _llama_layer(rank: int, kv_heads: int) -> None:
    hidden, head_size, heads, inter = 16, 4, 4, 8
    x = weights(90, 6, hidden)
    ws = qkv_weights(91, heads, kv_heads, head_size, hidden)
    w_o, w_g, w_u, w_d = (weights(95 + i, *s) for i, s in enumerate(
        [(hidden, heads * head_size), (inter, hidden), (inter, hidden), (hidden, inter)]
    ))  # fmt: skip
    outputs = []
    for build in (whole, lambda make: make()):
        qkv = build(lambda: impl.QKVParallelLinear(hidden, head_size, heads, kv_heads))
        load_qkv(qkv, ws)
        o_proj = load(build(lambda: impl.RowParallelLinear(heads * head_size, hidden)), w_o)
        gate_up = build(lambda: impl.MergedColumnParallelLinear(hidden, [inter, inter]))
        load(gate_up, w_g, 0)
        load(gate_up, w_u, 1)
        down = load(build(lambda: impl.RowParallelLinear(inter, hidden)), w_d)
        layer = (qkv, o_proj, gate_up, down, qkv.num_heads, qkv.num_kv_heads, head_size)
        outputs.append(llama_layer(x, *layer))
    assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.step4
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv heads split", "kv head replicated"])
def test_a_llama_layer_on_two_ranks_equals_the_unsharded_layer(kv_heads):
    on_two_ranks(_llama_layer, kv_heads)
