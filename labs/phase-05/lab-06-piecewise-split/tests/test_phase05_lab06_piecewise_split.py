"""Phase 05, lab 06 — the piecewise split: every attention call alone in a piece,
capturable pieces between.

The model is mini_vllm's `tiny` Llama (2 layers) on the CPU in float32, with a paged
KV cache filled with random numbers, so that attention reads real context.

Two kinds of comparison, on purpose:
- a split module against the graph it was cut from: the same nodes, so the same
  kernels, in the same order, on the same tensors. Outputs are equal bit for bit
  (torch.equal), on any number of threads.
- a graph (fx or Dynamo) against the eager model: not the same kernels. Eagerly on the
  CPU, mini_vllm's layers take shortcuts (`CustomOp.forward_cpu`: a product split over
  the threads, one fused RMSNorm op); a trace records the plain `forward_native` ops.
  The sums are rounded in another order, so these are compared within 1e-5
  (CLOSE below), which any real mistake exceeds by orders of magnitude.

The tests of steps 2 and 3 take their graphs from the course's own tracer
(mini_vllm.compilation.split.trace_with_opaque_attention) and, for step 3, decide
what an attention node is with a check written here, so that a bug in an earlier step
does not show up as a failure of a later one. The last tests put your three functions
together.
"""

import dataclasses

import pytest
import torch
import torch.fx

import mini_vllm.compilation.attention_op  # noqa: F401  (registers torch.ops.mini_vllm.attention)
import mini_vllm.compilation.split as reference
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.attention.paged import (
    PagedAttentionBackend,
    PagedAttentionMetadata,
    allocate_paged_kv_caches,
)
from mini_vllm.compilation.attention_op import use_attention_op
from mini_vllm.compilation.split import trace_with_opaque_attention as course_trace
from mini_vllm.config.capture_sizes import default_capture_sizes
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import set_forward_context
from mini_vllm.layers.attention import (
    Attention,
    attention_layers,
    bind_kv_caches,
    static_forward_context,
)
from mini_vllm.layers.custom_op import CustomOp
from mini_vllm.models.loader import build_model, load_model

impl = implementation(__file__, starter="split.py", reference="mini_vllm.compilation.split")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab06_answers"
)

BLOCK = 4
NUM_BLOCKS = 16
# A graph against the eager model (different kernels, float32, values of order 1).
CLOSE = {"rtol": 1e-5, "atol": 2e-5}


def random_caches(config, seed=0):
    caches = allocate_paged_kv_caches(
        config.num_hidden_layers,
        NUM_BLOCKS,
        BLOCK,
        config.num_key_value_heads,
        config.head_dim,
        torch.float32,
        "cpu",
    )
    generator = torch.Generator().manual_seed(seed)
    for cache in caches:
        cache.copy_(torch.randn(cache.shape, generator=generator))
    return caches


def tiny_model():
    """The tiny Llama with a random paged KV cache bound to its attention layers."""
    model, _, config = load_model("tiny", device="cpu", dtype=torch.float32, seed=0, progress=False)
    bind_kv_caches(model, PagedAttentionBackend(), random_caches(config))
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def num_layers(model):
    return model.config.num_hidden_layers


def batch(rows):
    """Inputs and attention metadata for rows given as
    (tokens already cached, new tokens, block table)."""
    ids, positions, slots, query_lens, seq_lens = [], [], [], [], []
    for cached, new, table in rows:
        for p in range(cached, cached + new):
            ids.append((7 * p + 3 * len(ids)) % 256)
            positions.append(p)
            slots.append(table[p // BLOCK] * BLOCK + p % BLOCK)
        query_lens.append(new)
        seq_lens.append(cached + new)
    width = max(len(table) for _, _, table in rows)
    metadata = PagedAttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([table + [0] * (width - len(table)) for _, _, table in rows]),
        seq_lens=torch.tensor(seq_lens),
        query_lens=query_lens,
        seq_lens_host=seq_lens,
        uniform_decode=all(new == 1 for _, new, _ in rows)
        and all(cached > 0 for cached, _, _ in rows),
    )
    return torch.tensor(ids), torch.tensor(positions), metadata


# Two fresh prompts of 3 and 5 tokens.
PREFILL = [(0, 3, [0]), (0, 5, [1, 2])]
# Three requests decoding one token each over cached context.
DECODE = [(5, 1, [3, 4]), (2, 1, [5]), (9, 1, [6, 7, 8])]
# A decode row and a prompt chunk that continues after 2 cached tokens.
MIXED = [(4, 1, [9, 10]), (2, 3, [11, 12])]


def run(fn, rows, model=None):
    """`fn` on the batch of `rows`; `model`: whose layers the attention op may look up."""
    ids, positions, metadata = batch(rows)
    layers = static_forward_context(model) if model is not None else None
    with torch.inference_mode(), set_forward_context(CUDAGraphMode.NONE, None, metadata, layers):
        return fn(ids, positions).clone()


def _is_attention_call(node):
    return node.op == "call_function" and "mini_vllm.attention" in str(node.target)


def is_attention_layer(gm):
    """This file's own test for the fx form: a call_module
    node whose module is an Attention layer."""
    return lambda node: (
        node.op == "call_module" and isinstance(gm.get_submodule(node.target), Attention)
    )


def compute_nodes(module):
    return [n for n in module.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]


def attention_calls(module):
    """Attention nodes in a piece, in either form, found by this file's own checks."""
    found = []
    for node in module.graph.nodes:
        if node.op == "call_module" and isinstance(module.get_submodule(node.target), Attention):
            found.append(node)
        elif node.op == "call_function" and "mini_vllm.attention" in str(node.target):
            found.append(node)
    return found


@pytest.fixture(scope="module")
def course_graph(model):
    return course_trace(model.model)


def split_course_graph(gm):
    """Your split of the course's trace (called in each
    test, so a TODO fails the test, not its set-up)."""
    split, items = impl.split_graph(gm, is_attention_layer(gm))
    return gm, split, items


def custom_op_graph(leading_op=False):
    """A hand-built graph with the custom op, as Dynamo would record it.

    x -> (add) -> attention(q, k, v, out1) -> attention(q, k, v, out2) -> add(out1, out2)
    Two attention calls back to back; with `leading_op=False` the first node of the graph
    is already an attention call.
    """
    graph = torch.fx.Graph()
    q, k, v, out1, out2 = (graph.placeholder(name) for name in ("q", "k", "v", "out1", "out2"))
    if leading_op:
        q = graph.call_function(torch.add, (q, 1.0))
    graph.call_function(torch.ops.mini_vllm.attention.default, (q, k, v, out1, "layer.0"))
    graph.call_function(torch.ops.mini_vllm.attention, (q, k, v, out2, "layer.1"))
    total = graph.call_function(torch.add, (out1, out2))
    graph.output(total)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# -- step 1: the tracer ------------------------------------------------------------------


@pytest.mark.step1
def test_traced_graph_keeps_each_attention_layer_as_one_call_module_node(model, num_layers):
    gm = impl.trace_with_opaque_attention(model.model)
    modules = [gm.get_submodule(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    # The attention layers stay opaque. The linear layers, norms and rotary embedding
    # land in the capturable pieces: traced through, or kept as one call each (CustomOp
    # layers, which pick their kernel when they run); whole decoder layers may not.
    assert all(isinstance(m, (Attention, CustomOp)) for m in modules), [
        type(m).__name__ for m in modules
    ]
    attention = [m for m in modules if isinstance(m, Attention)]
    assert [m.layer_idx for m in attention] == list(range(num_layers))


@pytest.mark.step1
def test_traced_graph_computes_what_the_model_computes_for_every_batch_kind(model):
    gm = impl.trace_with_opaque_attention(model.model)
    assert isinstance(gm, torch.fx.GraphModule)
    # One trace, three kinds of batch: nothing about one batch may be baked into the graph.
    for rows in (PREFILL, DECODE, MIXED):
        torch.testing.assert_close(run(gm, rows), run(model.model, rows), **CLOSE)


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes(model):
    class EveryModuleALeaf(torch.fx.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return True

    graph = EveryModuleALeaf().trace(model.model)
    check_predictions(
        answers,
        {"LEAF_EVERYTHING_CALL_MODULES": sum(n.op == "call_module" for n in graph.nodes)},
    )


@pytest.mark.step1
def test_the_trace_runs_on_the_models_own_weights_and_kv_cache():
    # The engine traces the model before it knows its weights' final values or its KV
    # cache's size: it loads the weights and binds the cache it sized afterwards.
    model = tiny_model()
    gm = impl.trace_with_opaque_attention(model.model)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(0.5)
    fresh = [torch.zeros_like(cache) for cache in random_caches(model.config)]
    bind_kv_caches(model, PagedAttentionBackend(), fresh)
    got = run(gm, PREFILL)
    assert all(cache.abs().sum() > 0 for cache in fresh), (
        "the graph wrote its keys and values into a KV cache of its own, not into the one "
        "bound to the model: does your trace run on a copy of the model?"
    )
    torch.testing.assert_close(got, run(model.model, PREFILL), **CLOSE)
    assert attention_layers(gm) == attention_layers(model.model)


# -- step 2: what is an attention node -----------------------------------------------------


@pytest.mark.step2
def test_is_attention_node_finds_exactly_the_attention_layers_of_an_fx_trace(model, num_layers):
    gm = course_trace(model.model)
    test = impl.is_attention_node(gm)
    found = [n for n in gm.graph.nodes if test(n)]
    expected = [n for n in gm.graph.nodes if is_attention_layer(gm)(n)]
    assert found == expected
    assert len(found) == num_layers


@pytest.mark.step2
def test_is_attention_node_finds_the_custom_op_as_packet_and_as_overload():
    gm = custom_op_graph(leading_op=True)
    test = impl.is_attention_node(gm)
    verdicts = {str(n.target): test(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert verdicts == {
        str(torch.add): False,
        str(torch.ops.mini_vllm.attention.default): True,
        str(torch.ops.mini_vllm.attention): True,
    }
    assert not any(test(n) for n in gm.graph.nodes if n.op in ("placeholder", "output"))


@pytest.mark.step2
def test_is_attention_node_rejects_other_modules_and_other_attention_functions():
    # A linear layer that lives in an attention block is still just a linear layer.
    root = torch.nn.Module()
    root.self_attn = torch.nn.Module()
    root.self_attn.o_proj = torch.nn.Linear(4, 4)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    projected = graph.call_module("self_attn.o_proj", (x,))
    q = graph.call_method("view", (projected, 1, 1, 2, 2))
    sdpa = graph.call_function(torch.nn.functional.scaled_dot_product_attention, (q, q, q))
    mm = graph.call_function(torch.ops.aten.mm.default, (x, x))
    graph.output((sdpa, mm))
    gm = torch.fx.GraphModule(root, graph)
    test = impl.is_attention_node(gm)
    assert [n.name for n in gm.graph.nodes if test(n)] == []


# -- step 3: the split ---------------------------------------------------------------------


def compute_node_counts(items):
    return [len(compute_nodes(item.module)) for item in items if not item.is_splitting_graph]


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes(model):
    config = dataclasses.replace(model.config, num_hidden_layers=30)  # SmolLM2-135M's depth
    deep = build_model(config, torch.device("cpu"), torch.float32).model
    gm = reference.trace_with_opaque_attention(deep)
    _, items = reference.split_graph(gm, reference.is_attention_node(gm))
    captured = sum(not item.is_splitting_graph for item in items)
    sizes = default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    _, back_to_back = reference.split_graph(custom_op_graph(), _is_attention_call)
    tiny = reference.trace_with_opaque_attention(model.model)
    _, tiny_items = reference.split_graph(tiny, reference.is_attention_node(tiny))
    counts = compute_node_counts(tiny_items)
    largest = counts.index(max(counts))
    check_predictions(
        answers,
        {
            "PIECES_30_LAYERS": len(items),
            "CAPTURED_PIECES_30_LAYERS": captured,
            "PIECEWISE_GRAPHS_51_SIZES": captured * len(sizes),
            "FULL_GRAPHS_51_SIZES": len(sizes),
            "PIECES_OF_A1_A2_ADD": len(back_to_back),
            "LARGEST_CAPTURABLE_PIECE": (
                "first" if largest == 0 else "last" if largest == len(counts) - 1 else "middle"
            ),
        },
    )


@pytest.mark.step3
def test_split_gives_layers_plus_one_pieces_alternating_capturable_and_attention(
    course_graph, num_layers
):
    _, _, items = split_course_graph(course_graph)
    assert len(items) == num_layers + 1 + num_layers
    assert [item.is_splitting_graph for item in items] == [False, True] * num_layers + [False]
    assert sum(not item.is_splitting_graph for item in items) == num_layers + 1


@pytest.mark.step3
def test_every_attention_call_is_alone_in_its_piece_in_layer_order(course_graph, num_layers):
    _, _, items = split_course_graph(course_graph)
    layers_seen = []
    for item in (i for i in items if i.is_splitting_graph):
        nodes = compute_nodes(item.module)
        assert len(nodes) == 1, f"{item.submod_name} holds {[n.format_node() for n in nodes]}"
        assert nodes[0].op == "call_module"
        layers_seen.append(item.module.get_submodule(nodes[0].target).layer_idx)
    assert layers_seen == list(range(num_layers))


@pytest.mark.step3
def test_no_capturable_piece_contains_attention_and_none_is_empty(course_graph):
    _, _, items = split_course_graph(course_graph)
    for item in (i for i in items if not i.is_splitting_graph):
        assert attention_calls(item.module) == [], f"{item.submod_name} would capture attention"
        assert compute_nodes(item.module), f"{item.submod_name} is empty"


@pytest.mark.step3
def test_split_items_are_the_split_modules_children_in_graph_id_order(course_graph):
    _, split, items = split_course_graph(course_graph)
    ids = [item.graph_id for item in items]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for item in items:
        assert item.submod_name == f"submod_{item.graph_id}"
        assert getattr(split, item.submod_name) is item.module
    children = {name for name, _ in split.named_children() if name.startswith("submod_")}
    assert children == {item.submod_name for item in items}


@pytest.mark.step3
def test_split_module_equals_the_unsplit_graph_for_a_prefill_batch(course_graph):
    gm, split, _ = split_course_graph(course_graph)
    assert torch.equal(run(split, PREFILL), run(gm, PREFILL))


@pytest.mark.step3
def test_split_module_equals_the_unsplit_graph_for_a_decode_batch(course_graph):
    gm, split, _ = split_course_graph(course_graph)
    assert torch.equal(run(split, DECODE), run(gm, DECODE))


@pytest.mark.step3
def test_a_model_without_attention_is_one_capturable_piece():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))
    gm = course_trace(mlp)
    split, items = impl.split_graph(gm, lambda node: False)
    assert [(item.submod_name, item.is_splitting_graph) for item in items] == [
        (items[0].submod_name, False)
    ]
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(split(x), gm(x))


@pytest.mark.step3
@pytest.mark.parametrize("leading_op", [False, True], ids=["attention-first", "add-first"])
def test_adjacent_attention_calls_leave_no_empty_piece(leading_op):
    gm = custom_op_graph(leading_op)
    is_op = _is_attention_call
    _, items = impl.split_graph(gm, is_op)
    expected = ([False] if leading_op else []) + [True, True, False]
    assert [item.is_splitting_graph for item in items] == expected
    for item in items:
        assert compute_nodes(item.module), f"{item.submod_name} is empty"
        if item.is_splitting_graph:
            assert len(compute_nodes(item.module)) == 1


@pytest.mark.step3
def test_attention_as_the_last_node_leaves_no_empty_piece_after_it():
    graph = torch.fx.Graph()
    q, out = graph.placeholder("q"), graph.placeholder("out")
    x = graph.call_function(torch.add, (q, 1.0))
    graph.call_function(torch.ops.mini_vllm.attention.default, (x, x, x, out, "layer.0"))
    graph.output(out)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    _, items = impl.split_graph(gm, _is_attention_call)
    assert [item.is_splitting_graph for item in items] == [False, True]


def write_into(out, value):
    """Stands for attention: writes its result into a buffer it was given, returns nothing."""
    out.copy_(value * 3)


@pytest.mark.step3
def test_a_piece_that_reads_an_ops_output_buffer_runs_after_the_op():
    # As in a Dynamo graph: the piece before attention allocates its output buffer,
    # attention fills it and returns nothing, and the next piece reads the buffer. The
    # only thing that orders the read after the write is the order of the graph.
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    out = graph.call_function(torch.zeros_like, (x,))
    y = graph.call_function(torch.add, (x, 1.0))
    graph.call_function(write_into, (out, y))
    graph.output(graph.call_function(torch.mul, (out, 2.0)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    split, items = impl.split_graph(gm, lambda node: node.target is write_into)
    assert [item.is_splitting_graph for item in items] == [False, True, False]
    x = torch.ones(3)
    assert torch.equal(gm(x), torch.full((3,), 12.0))
    assert torch.equal(split(x), gm(x)), (
        "the split module read the buffer before the op wrote it: its pieces run in "
        f"another order than the graph's nodes:\n{split.code}"
    )


@pytest.mark.step3
def test_pieces_come_back_in_graph_order_even_past_ten_pieces():
    # Six attention calls give thirteen pieces: as strings, "submod_10" sorts before "submod_2".
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    outs = [graph.placeholder(f"out{i}") for i in range(6)]
    for i, out in enumerate(outs):
        x = graph.call_function(torch.add, (x, 1.0))
        graph.call_function(torch.ops.mini_vllm.attention.default, (x, x, x, out, f"layer.{i}"))
    graph.output(graph.call_function(torch.add, (x, outs[-1])))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    is_op = _is_attention_call
    _, items = impl.split_graph(gm, is_op)
    assert [item.is_splitting_graph for item in items] == [False, True] * 6 + [False]
    layer_names = [
        compute_nodes(item.module)[0].args[4] for item in items if item.is_splitting_graph
    ]
    assert layer_names == [f"layer.{i}" for i in range(6)], (
        f"the attention pieces come back in the order {layer_names}: how did you sort them?"
    )


# -- all together --------------------------------------------------------------------------


@pytest.mark.step3
def test_your_trace_predicate_and_split_run_the_model_exactly(model, num_layers):
    gm = impl.trace_with_opaque_attention(model.model)
    split, items = impl.split_graph(gm, impl.is_attention_node(gm))
    assert [item.is_splitting_graph for item in items] == [False, True] * num_layers + [False]
    for rows in (PREFILL, DECODE, MIXED):
        got = run(split, rows)
        assert torch.equal(got, run(gm, rows))  # the split changes nothing, bit for bit
        torch.testing.assert_close(got, run(model.model, rows), **CLOSE)


@pytest.mark.step3
def test_dynamo_graph_splits_at_the_custom_op_and_runs_like_eager():
    # A model of its own: its attention layers call the custom op, as under VLLM_COMPILE.
    model = tiny_model()
    expected = {
        name: run(model.model, rows) for name, rows in (("prefill", PREFILL), ("decode", DECODE))
    }
    use_attention_op(model)
    seen, unsplit_outputs = [], []

    def backend(gm, example_inputs):
        # What mini_vllm's PiecewiseCompileBackend does first, without Inductor or graphs.
        split, items = impl.split_graph(gm, impl.is_attention_node(gm))
        seen.append(items)

        def run_split_and_keep_unsplit(*args):
            # The unsplit graph runs too, for the bit-for-bit comparison. Both write the
            # same keys and values to the same cache slots, so the second changes nothing.
            unsplit_outputs.append(gm(*args))
            return split(*args)

        return run_split_and_keep_unsplit

    lm = model.model
    compiled = torch.compile(
        lambda ids, pos: lm.forward(ids, pos), backend=backend, fullgraph=True, dynamic=True
    )
    got = {
        name: run(compiled, rows, model)
        for name, rows in (("prefill", PREFILL), ("decode", DECODE))
    }
    layers = model.config.num_hidden_layers
    assert len(seen) == 1, "one trace serves both batches (the token dimension is dynamic)"
    assert [item.is_splitting_graph for item in seen[0]] == [False, True] * layers + [False]
    for item in seen[0]:
        calls = attention_calls(item.module)
        assert len(calls) == (1 if item.is_splitting_graph else 0)
        if item.is_splitting_graph:
            assert calls[0].op == "call_function" and len(compute_nodes(item.module)) == 1
    assert len(unsplit_outputs) == 2
    for name, unsplit in zip(expected, unsplit_outputs):
        unsplit = unsplit[0] if isinstance(unsplit, (tuple, list)) else unsplit
        assert torch.equal(got[name], unsplit), name  # the same Dynamo graph, cut or not
        torch.testing.assert_close(got[name], expected[name], **CLOSE)  # eager's kernels
