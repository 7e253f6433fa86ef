"""Phase 05, lab 06 (the piecewise split): its steps and the mistakes its tests must catch."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.compilation.split"
LEAF_RULE = (
    "return isinstance(module, OPAQUE_LAYERS) or super().is_leaf_module(module, qualified_name)"
)

STEPS = {
    1: [f"{MODULE}:trace_with_opaque_attention", f"{MODULE}:_OpaqueAttentionTracer.is_leaf_module"],
    2: [f"{MODULE}:is_attention_node"],
    3: [f"{MODULE}:split_graph"],
}

MUTANTS = [
    Mutant(
        name="every module a leaf",
        mistake="The tracer keeps every module opaque, not only attention: the graph is a few "
        "calls to whole decoder layers and the projections, norms and MLPs cannot be captured.",
        module=MODULE,
        old=LEAF_RULE,
        new="return True",
    ),
    Mutant(
        name="attention traced through",
        mistake="The tracer keeps the default leaf rule only, so it traces into attention and "
        "bakes one batch's prefill/decode path and lengths into the graph.",
        module=MODULE,
        old=LEAF_RULE,
        new="return super().is_leaf_module(module, qualified_name)",
    ),
    Mutant(
        name="leaf by name",
        mistake="The tracer keeps a module opaque when 'attn' is in its qualified name, which "
        "catches the whole self_attn block (projections and rotary embedding included) instead "
        "of the Attention layer inside it.",
        module=MODULE,
        old=LEAF_RULE,
        new='return "attn" in qualified_name or super().is_leaf_module(module, qualified_name)',
    ),
    Mutant(
        name="the trace copies the model",
        mistake="The traced GraphModule is built on a deep copy of the model, so the weights "
        "loaded and the KV cache bound after the trace never reach the graph.",
        module=MODULE,
        old="return torch.fx.GraphModule(model, graph, ",
        new='return torch.fx.GraphModule(__import__("copy").deepcopy(model), graph, ',
    ),
    Mutant(
        name="every call_module node is attention",
        mistake="Takes every call_module node for attention, which splits at every layer a "
        "trace keeps opaque (the CustomOp layers of the course's trace) as well.",
        module=MODULE,
        old="return isinstance(gm.get_submodule(node.target), Attention)",
        new="return True",
    ),
    Mutant(
        name="attention found by name",
        mistake="Recognises an attention layer by 'attn' in the node's target, which also "
        "matches any other layer inside a self-attention block (its output projection).",
        module=MODULE,
        old="return isinstance(gm.get_submodule(node.target), Attention)",
        new='return "attn" in str(node.target)',
    ),
    Mutant(
        name="custom op only as overload",
        mistake="Compares the target with `torch.ops.mini_vllm.attention.default` only, so a "
        "graph that calls the op packet is not split there.",
        module=MODULE,
        old='return getattr(node.target, "name", lambda: "")() in ("mini_vllm::attention",) or (\n'
        '                str(node.target).startswith("mini_vllm.attention")\n'
        "            )",
        new="return node.target is torch.ops.mini_vllm.attention.default",
    ),
    Mutant(
        name="any attention-named function",
        mistake="Splits at every function with 'attention' in its name, PyTorch's "
        "scaled_dot_product_attention included.",
        module=MODULE,
        old='str(node.target).startswith("mini_vllm.attention")',
        new='"attention" in str(node.target)',
    ),
    Mutant(
        name="Dynamo form forgotten",
        mistake="Handles only the fx form (a call_module Attention) and never the custom op "
        "call_function nodes Dynamo records, so a compiled model is not split at all.",
        module=MODULE,
        old='        if node.op == "call_function":\n            return getattr',
        new='        if node.op == "call_function" and False:\n            return getattr',
    ),
    Mutant(
        name="no new piece after attention",
        mistake="Starts a new piece before each attention node but not after it, so the "
        "attention shares its piece with the projections and MLP that follow.",
        module=MODULE,
        old="            piece += 1  # and start a new one after it\n",
        new="",
    ),
    Mutant(
        name="no new piece before attention",
        mistake="Starts a new piece only after each attention node, so the attention lands in "
        "the capturable piece before it.",
        module=MODULE,
        old="            piece += 1  # close the piece before it (if any node went there)\n",
        new="",
    ),
    Mutant(
        name="pieces regrouped freely",
        mistake="Calls split_module without keeping the original order, so a piece that reads "
        "attention's output buffer may run before the attention that writes it.",
        module=MODULE,
        old="keep_original_order=True",
        new="keep_original_order=False",
    ),
    Mutant(
        name="pieces assumed numbered 0 to n",
        mistake="Lists the pieces by counting from 0 to the last number given out, as if every "
        "number had a child; a number no node received (before a leading attention call, "
        "between two adjacent ones) becomes a piece with no module.",
        module=MODULE,
        old="    items = []\n    for name, module in split.named_children():",
        new="    items = [\n"
        "        SplitItem(\n"
        '            f"submod_{i}", i, i in splitting_pieces, getattr(split, f"submod_{i}", None)\n'
        "        )\n"
        "        for i in range(piece + 1)\n"
        "        if i <= max(piece_of.values(), default=0)\n"
        "    ]\n"
        "    return split, items\n"
        "    for name, module in split.named_children():",
    ),
    Mutant(
        name="pieces sorted by name",
        mistake="Sorts the pieces by their names as strings, so submod_10 comes before "
        "submod_2 once a model has five or more attention layers.",
        module=MODULE,
        old="items.sort(key=lambda item: item.graph_id)",
        new="items.sort(key=lambda item: item.submod_name)",
    ),
    Mutant(
        name="splitting piece misflagged",
        mistake="Flags a piece as an attention piece because it holds a single call, so a "
        "one-op piece between two attention calls is taken for attention too.",
        module=MODULE,
        old="items.append(SplitItem(name, graph_id, graph_id in splitting_pieces, module))",
        new="items.append(\n"
        "            SplitItem(\n"
        "                name,\n"
        "                graph_id,\n"
        '                sum(n.op.startswith("call_") for n in module.graph.nodes) == 1,\n'
        "                module,\n"
        "            )\n"
        "        )",
    ),
]
