"""The CUDA-graph model runner on both graph backends: CPU recording graphs and real CUDA graphs.

Every test runs twice: on the CPU with the recording backend (CPU-OK) and on CUDA
with torch.cuda.CUDAGraph (GPU-REQ). Tolerances:
- CPU: a replay re-runs the very same ATen ops on the same tensors, so a graph's
  output equals an eager run of the same batch bit for bit.
- CUDA: replay launches the kernels the capture recorded, normally the same ones
  eager runs, but cuBLAS and SDPA may pick different algorithms (workspace, split-K)
  inside a capture, so we allow float32 rounding: 1e-4 relative.
- Padding changes the batch dimension of every matrix product (3 rows become 4),
  which may change how the product is blocked and summed; compared with an
  *unpadded* eager run, rows agree to float32 rounding (1e-5), not bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch

from mini_vllm import LLM, SamplingParams
from mini_vllm.compilation.monitor import (
    cudagraph_capturing_enabled,
    set_cudagraph_capturing_enabled,
)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.model_inputs import ModelInputs, pad_inputs
from mini_vllm.forward_context import BatchDescriptor, set_forward_context

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
BLOCK = 4


def make_llm(device, **kwargs):
    kwargs.setdefault("max_num_seqs", 8)
    kwargs.setdefault("max_model_len", 128)
    kwargs.setdefault("block_size", BLOCK)
    return LLM("tiny", device=device, dtype="float32", **kwargs)


def prompts(n, seed=0, longest=20):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(2, longest))] for _ in range(n)]


def decode_inputs(runner, size, seed):
    """A uniform-decode batch of `size` rows over random cache contents."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 60, (size,), generator=gen).tolist()
    tables = [
        [(7 * row + j) % runner.num_kv_blocks for j in range(p // BLOCK + 1)]
        for row, p in enumerate(positions)
    ]
    return ModelInputs(
        input_ids=torch.randint(0, 256, (size,), generator=gen).tolist(),
        positions=positions,
        slot_mapping=[t[p // BLOCK] * BLOCK + p % BLOCK for t, p in zip(tables, positions)],
        query_lens=[1] * size,
        seq_lens=[p + 1 for p in positions],
        block_tables=tables,
        logits_indices=list(range(size)),
        sampling_rows=list(range(size)),
        uniform_decode=True,
    )


def run_forward(runner, inputs, mode, descriptor, table_width=None):
    """One forward under `mode`. `table_width` defaults to what the runner would use;
    pass the graph's width to an eager run to compare like with like (a wider block
    table adds masked positions, which may change the order of the softmax sums)."""
    n = inputs.num_tokens
    metadata = runner._copy_in(
        inputs, table_width or runner._table_width(max(inputs.seq_lens), mode)
    )
    with torch.inference_mode(), set_forward_context(mode, descriptor, metadata):
        return runner.graphs.forward(runner.input_ids[:n], runner.positions[:n]).clone()


def assert_graph_matches(device, graph, eager):
    if device == "cpu":
        assert torch.equal(graph, eager)
    else:
        torch.testing.assert_close(graph, eager, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=DEVICES)
def graph_llm(request):
    llm = make_llm(
        request.param, cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2, 4, 8]
    )
    torch.manual_seed(0)
    for cache in llm.engine.runner.kv_caches:
        cache.normal_()
    return request.param, llm


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_full_graph_equals_eager_for_every_captured_decode_size(graph_llm, size):
    device, llm = graph_llm
    runner = llm.engine.runner
    inputs = decode_inputs(runner, size, seed=size)
    mode, key = runner.dispatcher.dispatch(size, uniform_decode=True)
    assert mode is CUDAGraphMode.FULL and key.num_tokens == size
    graph = run_forward(runner, inputs, mode, key)
    eager = run_forward(
        runner, inputs, CUDAGraphMode.NONE, None, table_width=runner.max_blocks_per_seq
    )
    assert_graph_matches(device, graph, eager)


@pytest.mark.parametrize("size", [1, 4, 8])
def test_piecewise_graph_equals_eager_for_mixed_batches(graph_llm, size):
    device, llm = graph_llm
    runner = llm.engine.runner
    # A mixed batch: one prefill chunk of `size` tokens at positions 3.. of a sequence.
    table = [5, 6, 7, 8][: (3 + size + BLOCK - 1) // BLOCK]
    positions = list(range(3, 3 + size))
    inputs = ModelInputs(
        input_ids=list(range(10, 10 + size)),
        positions=positions,
        slot_mapping=[table[p // BLOCK] * BLOCK + p % BLOCK for p in positions],
        query_lens=[size],
        seq_lens=[3 + size],
        block_tables=[table],
        logits_indices=[size - 1],
        sampling_rows=[0],
        uniform_decode=False,
    )
    mode, key = runner.dispatcher.dispatch(size, uniform_decode=False)
    assert mode is CUDAGraphMode.PIECEWISE
    graph = run_forward(runner, inputs, mode, key)
    eager = run_forward(runner, inputs, CUDAGraphMode.NONE, None)
    assert_graph_matches(device, graph, eager)


def test_padded_batch_runs_on_the_next_graph_and_real_rows_match(graph_llm):
    device, llm = graph_llm
    runner = llm.engine.runner
    inputs = decode_inputs(runner, 3, seed=11)
    mode, key = runner.dispatcher.dispatch(3, uniform_decode=True)
    assert (mode, key) == (CUDAGraphMode.FULL, BatchDescriptor(4, 4, uniform=True))
    padded = pad_inputs(inputs, key.num_tokens)
    graph = run_forward(runner, padded, mode, key)
    assert graph.shape[0] == 4
    same_shape = run_forward(
        runner, padded, CUDAGraphMode.NONE, None, table_width=runner.max_blocks_per_seq
    )
    assert_graph_matches(device, graph, same_shape)
    unpadded = run_forward(runner, inputs, CUDAGraphMode.NONE, None)
    torch.testing.assert_close(graph[:3], unpadded, rtol=1e-5, atol=1e-5)


def test_replay_without_copying_inputs_returns_the_stale_result(graph_llm):
    _, llm = graph_llm
    runner = llm.engine.runner
    first = decode_inputs(runner, 2, seed=1)
    mode, key = runner.dispatcher.dispatch(2, uniform_decode=True)
    out_first = run_forward(runner, first, mode, key)
    entry = runner.graphs.full_wrapper.entries[key]
    # New token ids in a fresh tensor are invisible to the graph: it reads its buffers.
    fresh_ids = torch.tensor([99, 98], device=runner.device)
    assert not torch.equal(fresh_ids, runner.input_ids[:2])
    entry.graph.replay()
    assert torch.equal(entry.output, out_first)
    # Copying them into the persistent buffer is what makes the replay see them.
    runner.input_ids[:2].copy_(fresh_ids)
    entry.graph.replay()
    assert not torch.equal(entry.output, out_first)


def test_replay_returns_the_same_output_object(graph_llm):
    _, llm = graph_llm
    runner = llm.engine.runner
    mode, key = runner.dispatcher.dispatch(4, uniform_decode=True)
    inputs = decode_inputs(runner, 4, seed=3)
    metadata = runner._copy_in(inputs, runner._table_width(max(inputs.seq_lens), mode))
    with torch.inference_mode(), set_forward_context(mode, key, metadata):
        a = runner.graphs.forward(runner.input_ids[:4], runner.positions[:4])
        b = runner.graphs.forward(runner.input_ids[:4], runner.positions[:4])
    assert a is b


def test_new_shape_after_capture_window_closed_raises(graph_llm):
    _, llm = graph_llm
    runner = llm.engine.runner
    inputs = decode_inputs(runner, 3, seed=5)
    metadata = runner._copy_in(inputs, runner.max_blocks_per_seq)
    # Each test starts with the window open (tests/conftest.py); close it as the engine's
    # start-up did, which test_capture_window_closes_after_start_up checks.
    set_cudagraph_capturing_enabled(False)
    with pytest.raises(RuntimeError, match="capture window closed"):
        with (
            torch.inference_mode(),
            set_forward_context(CUDAGraphMode.FULL, BatchDescriptor(3, 3, True), metadata),
        ):
            runner.graphs.forward(runner.input_ids[:3], runner.positions[:3])


@pytest.mark.parametrize("device", DEVICES)
def test_capture_window_closes_after_start_up(device):
    make_llm(device, cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2])
    assert not cudagraph_capturing_enabled()


def test_piecewise_split_gives_one_piece_more_than_layers(graph_llm):
    _, llm = graph_llm
    graphs = llm.engine.runner.graphs
    layers = llm.engine.model.config.num_hidden_layers
    captured = [item for item in graphs.split_items if not item.is_splitting_graph]
    attention = [item for item in graphs.split_items if item.is_splitting_graph]
    assert len(captured) == layers + 1 and len(attention) == layers
    assert len(graphs.piece_wrappers) == layers + 1


@pytest.mark.parametrize("device", DEVICES)
def test_batch_33_runs_on_the_40_graph_and_only_33_rows_come_back(device):
    llm = make_llm(
        device,
        max_num_seqs=40,
        cudagraph_mode="full_and_piecewise",
        cudagraph_capture_sizes=[1, 8, 32, 40],
        max_num_batched_tokens=1024,
    )
    batch = prompts(33, seed=2, longest=6)
    outputs = llm.generate(
        batch, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    decode_steps = [s for s in llm.stats.steps if s.uniform_decode]
    assert decode_steps and all(
        s.num_reqs == 33 and s.num_padded_tokens == 40 for s in decode_steps
    )
    assert all(s.runtime_mode == "FULL" for s in decode_steps)
    assert [len(o.token_ids) for o in outputs] == [3] * 33
    eager = make_llm(device, max_num_seqs=40, max_num_batched_tokens=1024)
    expected = eager.generate(
        batch, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]


@pytest.mark.parametrize("device", DEVICES)
def test_batch_above_largest_size_runs_eagerly_and_counts_as_a_miss(device):
    llm = make_llm(device, cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2, 4])
    llm.generate(prompts(6, seed=4), GREEDY, use_tqdm=False)
    decode_steps = [s for s in llm.stats.steps if s.uniform_decode]
    above = [s for s in decode_steps if s.num_reqs > 4]
    assert above and all(
        s.runtime_mode == "NONE" and s.num_padded_tokens == s.num_tokens for s in above
    )
    hits = sum(1 for s in decode_steps if s.runtime_mode != "NONE")
    assert llm.stats.decode_graph_hit_rate == pytest.approx(hits / len(decode_steps))
    assert llm.stats.decode_graph_hit_rate < 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_full_and_piecewise_routes_decode_to_full_and_mixed_to_piecewise(device):
    llm = make_llm(
        device,
        cudagraph_mode="full_and_piecewise",
        cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32],
        max_num_batched_tokens=32,
    )
    llm.generate(prompts(8, seed=6, longest=10), GREEDY, use_tqdm=False)
    for step in llm.stats.steps:
        if step.uniform_decode:
            assert step.runtime_mode == "FULL"
        elif step.num_tokens <= 32:
            assert step.runtime_mode == "PIECEWISE"
    assert {"FULL", "PIECEWISE"} <= set(llm.stats.steps_per_runtime_mode)


@pytest.mark.parametrize("device", DEVICES)
def test_capture_runs_attention_for_full_keys_only(device, monkeypatch):
    # A PIECEWISE graph leaves attention out, so its warm-up and capture runs skip it;
    # a FULL graph records attention, so both of its runs compute it.
    from mini_vllm.forward_context import get_forward_context
    from mini_vllm.layers.attention import Attention

    keys_seen = []
    run_backend = Attention.run_backend  # every backend's way in, the kernels' one too

    def counting_run_backend(self, *args, **kwargs):
        context = get_forward_context()
        if not context.skip_attention:  # the runs where attention computes
            keys_seen.append(context.batch_descriptor)
        return run_backend(self, *args, **kwargs)

    monkeypatch.setattr(Attention, "run_backend", counting_run_backend)
    llm = make_llm(
        device, cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2, 4, 8]
    )
    runner = llm.engine.runner
    layers = runner.model.config.num_hidden_layers
    during_capture = [key for key in keys_seen if key is not None]  # compile's run has none
    full_keys = [key for mode, key in runner.dispatcher.all_keys() if mode is CUDAGraphMode.FULL]
    piecewise_keys = [
        key for mode, key in runner.dispatcher.all_keys() if mode is CUDAGraphMode.PIECEWISE
    ]
    assert full_keys and piecewise_keys
    assert all(key.uniform for key in during_capture)
    assert len(during_capture) == 2 * layers * len(full_keys)  # a warm-up and a capture each
    outputs = llm.generate(prompts(3, seed=2), GREEDY, use_tqdm=False)
    eager = make_llm(device).generate(prompts(3, seed=2), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in eager]


@pytest.mark.parametrize("device", DEVICES)
def test_hit_rate_and_padding_waste_are_counted_right(device):
    # Three requests of equal length: one prefill step of 3 x 5 tokens (15 -> 16,
    # piecewise), then decode steps of 3 rows padded to 4 (full).
    llm = make_llm(
        device, cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2, 4, 8, 16]
    )
    llm.generate(
        [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]],
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        use_tqdm=False,
    )
    steps = llm.stats.steps
    assert [(s.num_tokens, s.num_padded_tokens, s.runtime_mode) for s in steps] == (
        [(15, 16, "PIECEWISE")] + [(3, 4, "FULL")] * 4
    )
    assert llm.stats.decode_graph_hit_rate == 1.0
    assert llm.stats.padding_waste == pytest.approx((1 + 4 * 1) / (15 + 4 * 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise", "full_decode_only"])
def test_generated_tokens_with_graphs_equal_eager(device, mode):
    batch = prompts(10, seed=8)
    eager = make_llm(device).generate(batch, GREEDY, use_tqdm=False)
    graphs = make_llm(device, cudagraph_mode=mode, debug_cudagraphs=True)
    outputs = graphs.generate(batch, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in eager]
    assert graphs.stats.decode_graph_hit_rate > 0.5


def test_full_mode_is_downgraded_for_a_decode_only_backend():
    llm = make_llm("cpu", cudagraph_mode="full", cudagraph_capture_sizes=[1, 2])
    # The paged backend can capture only uniform single-token decode, and attention is
    # split: vLLM's rule turns FULL into FULL_AND_PIECEWISE.
    assert llm.engine.runner.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE


def test_enforce_eager_captures_nothing():
    llm = make_llm("cpu", enforce_eager=True, cudagraph_mode="full_and_piecewise")
    assert llm.engine.runner.cudagraph_mode is CUDAGraphMode.NONE
    assert llm.engine.runner.capture_report is None and llm.engine.runner.capture_sizes == []
