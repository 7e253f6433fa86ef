"""The package's layout holds: no import circle, the engine
apart from the teaching models, a map that names every part.

Imports are read from the source (ast), function-level ones included: an import moved
into a function still makes a circle, only a later one. Imports under
`if TYPE_CHECKING:` are for type checkers and never run, so they do not count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mini_vllm"

# What `LLM` runs. None of it may reach the teaching models
# (it would blur which code is the engine) or the tools.
ENGINE_ROOTS = ["mini_vllm.llm"]
NOT_ENGINE = ("mini_vllm.teaching", "mini_vllm.cudagraph", "mini_vllm.bench", "mini_vllm.cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(path: Path) -> set[str]:
    """The mini_vllm modules `path` imports (a `from
    package import submodule` counts as the submodule)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("mini_vllm"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("mini_vllm")
        ):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
            found.update(submodules or {node.module})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {name for name in found if name in MODULES}


# The package root's lazy `LLM` / `SamplingParams` attributes are sugar for users, not a
# dependency of any module: leave the root out, or every module would sit in one circle.
GRAPH = {
    name: imported_modules(path) - {"mini_vllm"}
    for name, path in MODULES.items()
    if name != "mini_vllm"
}


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components listed with their members sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_no_import_circle():
    circles = [c for c in strongly_connected_components(GRAPH) if len(c) > 1 or c[0] in GRAPH[c[0]]]
    assert not circles, (
        "modules that import each other (directly or through others):\n"
        + "\n".join(" <-> ".join(c) for c in circles)
    )


def reached_from(roots: list[str]) -> set[str]:
    """The modules `roots` import, directly or through others, and the roots."""
    reached, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(GRAPH.get(name, ()))
    return reached


def test_the_engine_never_reaches_the_teaching_models_or_the_tools():
    reached = reached_from(ENGINE_ROOTS)
    wrong = sorted(name for name in reached if name.startswith(NOT_ENGINE))
    assert not wrong, f"the engine ({', '.join(ENGINE_ROOTS)}) imports {wrong}"


def test_the_cycle_check_finds_a_circle():
    assert strongly_connected_components({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"],
        ["d"],
    ]


def test_the_map_names_every_part_of_the_package():
    parts = sorted(
        [p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        + [p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("__")]
    )
    package_map = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    readme = (ROOT / "README.md").read_text()
    readme_map = readme[readme.index("## What is inside") :]
    for where, text in (
        ("mini_vllm/__init__.py's docstring", package_map),
        ("README.md's 'What is inside'", readme_map),
    ):
        missing = [part for part in parts if not re.search(rf"(?<![\w/]){re.escape(part)}", text)]
        assert not missing, f"{where} does not name {missing}"


# The performance layer: the kernels, reached only through the table of ops.
KERNELS = "mini_vllm.kernels"
TABLE = "mini_vllm._custom_ops"


def _code_strings(path: Path) -> set[str]:
    """The string constants of `path`, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    }


def test_nothing_outside_the_kernels_imports_them():
    wrong = sorted(
        f"{name} imports {sorted(d for d in deps if d.startswith(KERNELS))}"
        for name, deps in GRAPH.items()
        if not name.startswith(KERNELS) and any(d.startswith(KERNELS) for d in deps)
    )
    assert not wrong, (
        "the kernels are reached only through mini_vllm/_custom_ops.py:\n" + "\n".join(wrong)
    )


def test_the_table_is_the_one_module_that_names_the_kernels():
    naming = sorted(
        name
        for name, path in MODULES.items()
        if not name.startswith(KERNELS) and KERNELS in _code_strings(path)
    )
    assert naming == [TABLE]


def test_triton_is_imported_by_the_kernels_alone():
    wrong = []
    for name, path in MODULES.items():
        if name.startswith(KERNELS) or name == "mini_vllm.compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            imported = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            wrong += [f"{name}: {m}" for m in imported if m.split(".")[0] == "triton"]
    assert not wrong, f"Triton imported outside mini_vllm/kernels/: {wrong}"


def test_the_reading_path_stays_out_of_the_performance_layer_but_for_the_table_and_compat():
    """`LLM` reaches the table (its layers call it) and compat (the engine logs the fast
    paths), never a kernel module."""
    reached = reached_from(ENGINE_ROOTS)
    assert not any(name.startswith(KERNELS) for name in reached)
    assert {TABLE, "mini_vllm.compat"} <= reached
