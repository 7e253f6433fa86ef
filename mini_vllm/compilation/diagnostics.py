"""Compile diagnostics a reader can run: graph breaks, the fullgraph check, recompiles.

PyTorch counterpart: `torch._dynamo.explain` (graph count, graph breaks and their
reasons), `torch.compile(..., fullgraph=True)` (fail on the first break instead of
falling back), and the recompile logs (`TORCH_LOGS=graph_breaks,recompiles`).
vLLM relies on the same: models must trace in one graph (its decorator compiles with
`fullgraph=True`), and its compile counters (vllm/compilation/counter.py) are checked
in tests to prove that nothing recompiles across batch sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mini_vllm import compat

__all__ = ["BreakReport", "explain_graph_breaks", "fullgraph_ok"]


@dataclass(frozen=True)
class BreakReport:
    graph_count: int
    graph_break_count: int
    reasons: list[str]

    def format(self) -> str:
        lines = [f"{self.graph_count} graph(s), {self.graph_break_count} graph break(s)"]
        lines += [f"  - {reason}" for reason in self.reasons]
        return "\n".join(lines)


# ANCHOR: explain
def explain_graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BreakReport:
    """Trace `fn(*args)` with Dynamo and report how many graphs it took and why it broke."""
    explanation = compat.dynamo_explain(fn)(*args, **kwargs)
    reasons = []
    for brk in explanation.break_reasons:
        where = ""
        if getattr(brk, "user_stack", None):
            frame = brk.user_stack[-1]
            where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
        reasons.append(f"{brk.reason.splitlines()[0]}{where}")
    return BreakReport(explanation.graph_count, explanation.graph_break_count, reasons)


# ANCHOR_END: explain


def fullgraph_ok(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, str]:
    """Compile with fullgraph=True (no code generation: the
    "eager" backend) and say whether it traced whole."""
    try:
        torch.compile(fn, fullgraph=True, backend="eager")(*args, **kwargs)
    except Exception as exc:  # Dynamo's Unsupported and friends
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return True, "traced as one graph"
