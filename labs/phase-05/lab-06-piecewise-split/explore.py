"""Run the README's questions on your code, beside your predictions: `python explore.py`.

Run it from this folder. It traces mini_vllm's tiny Llama (2 layers) and a 30-layer
Llama of the same width with your tracer, cuts them with your predicate and your split,
cuts a hand-built graph of two attention calls, and prints what your code gives next to
what you predicted in predictions.py. Where they differ, one of the two is wrong: the
step's tests say whether it is your code.
"""

from __future__ import annotations

import dataclasses

import predictions
import split as mine
import torch
import torch.fx

import mini_vllm.compilation.attention_op  # noqa: F401  (registers torch.ops.mini_vllm.attention)
from mini_vllm.config.capture_sizes import default_capture_sizes
from mini_vllm.models.config import MODEL_CONFIGS
from mini_vllm.models.loader import build_model

SIZES = len(default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192))


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError:
        print(f"  {what}: not written yet")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def show(name: str, value, source: str = "your code") -> None:
    yours = "(not run)" if value is None else repr(value)
    print(f"  {name:30} {source}: {yours:12} you predicted: {getattr(predictions, name)!r}")


def llama(layers: int) -> torch.nn.Module:
    """mini_vllm's tiny Llama with `layers` layers, weights left as allocated (tracing and
    splitting never look at their values)."""
    config = dataclasses.replace(MODEL_CONFIGS["tiny"], num_hidden_layers=layers)
    return build_model(config, torch.device("cpu"), torch.float32).model


def compute_nodes(module):
    return [n for n in module.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]


def cut(model):
    """Your trace, predicate and split of `model`: the pieces, or None."""
    gm = attempt("trace_with_opaque_attention", lambda: mine.trace_with_opaque_attention(model))
    if gm is None:
        return None
    test = attempt("is_attention_node", lambda: mine.is_attention_node(gm))
    if test is None:
        return None
    result = attempt("split_graph", lambda: mine.split_graph(gm, test))
    return None if result is None else result[1]


def two_attention_calls() -> torch.fx.GraphModule:
    """A1, A2, add: two attention calls back to back, the first one the graph's first node."""
    graph = torch.fx.Graph()
    q, k, v, out1, out2 = (graph.placeholder(n) for n in ("q", "k", "v", "out1", "out2"))
    graph.call_function(torch.ops.mini_vllm.attention.default, (q, k, v, out1, "layer.0"))
    graph.call_function(torch.ops.mini_vllm.attention.default, (q, k, v, out2, "layer.1"))
    graph.output(graph.call_function(torch.add, (out1, out2)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def main() -> None:
    tiny = llama(2)

    class EveryModuleALeaf(torch.fx.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return True

    print("Before step 1: what stays opaque")
    graph = EveryModuleALeaf().trace(tiny)
    leaves = [n.target for n in graph.nodes if n.op == "call_module"]
    print(f"  every module a leaf: call_module nodes {leaves}")
    show("LEAF_EVERYTHING_CALL_MODULES", len(leaves), "that tracer")
    gm = attempt("trace_with_opaque_attention", lambda: mine.trace_with_opaque_attention(tiny))
    if gm is not None:
        ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
        print(f"  your trace of the tiny model: {len(gm.graph.nodes)} nodes, call_module {ops}")

    print("\nBefore step 3: the pieces")
    items = cut(tiny)
    counts = None
    if items is not None:
        for item in items:
            kind = "attention (eager)" if item.is_splitting_graph else "capturable"
            print(f"  {item.submod_name}: {kind}, {len(compute_nodes(item.module))} compute nodes")
        counts = [len(compute_nodes(i.module)) for i in items if not i.is_splitting_graph]
    deep = cut(llama(30))
    captured = None if deep is None else sum(not item.is_splitting_graph for item in deep)
    show("PIECES_30_LAYERS", None if deep is None else len(deep))
    show("CAPTURED_PIECES_30_LAYERS", captured)
    show("PIECEWISE_GRAPHS_51_SIZES", None if captured is None else captured * SIZES)
    show("FULL_GRAPHS_51_SIZES", SIZES, "the ladder")
    graph = two_attention_calls()
    back_to_back = attempt(
        "split_graph", lambda: mine.split_graph(graph, mine.is_attention_node(graph))
    )
    show("PIECES_OF_A1_A2_ADD", None if back_to_back is None else len(back_to_back[1]))
    largest = None
    if counts:
        at = counts.index(max(counts))
        largest = "first" if at == 0 else "last" if at == len(counts) - 1 else "middle"
    show("LARGEST_CAPTURABLE_PIECE", largest)


if __name__ == "__main__":
    main()
