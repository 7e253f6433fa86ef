"""The private torch and Triton names, looked up in one place (mini_vllm/compat.py): on this
torch every fast path that needs no GPU is on, and a name that goes missing turns its fast
path off visibly (a warning, a doctor row), never silently and never with a crash."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from mini_vllm import compat
from mini_vllm.config.compilation import CompilationMode

CPU_PATHS = ("trace once", "compiled-model cache", "fusion passes", "Inductor caches")


def paths_by_name(kernels=None):
    return {path.name: path for path in compat.fast_paths(kernels)}


def test_this_torch_is_one_the_suites_ran_on_and_its_fast_paths_are_on():
    assert compat.torch_verified(), f"torch {torch.__version__} is not in VERIFIED_TORCH"
    paths = paths_by_name()
    for name in CPU_PATHS:
        assert paths[name].on, f"{name}: {paths[name].why}"
    assert not any(path.degraded for path in paths.values())


def test_the_report_is_one_line_with_the_versions_and_the_reasons():
    line = compat.fast_paths_line("on: rms_norm")
    assert "\n" not in line
    assert line.startswith(f"torch {torch.__version__}")
    assert "fast paths on: own kernels, " in line
    if not torch.cuda.is_available():
        assert "direct launch (no CUDA device)" in line


def _hide(monkeypatch, *missing: str) -> None:
    """Make `compat` see this torch without the private names `missing`."""
    real = compat._attribute
    monkeypatch.setattr(compat, "_attribute", lambda path: None if path in missing else real(path))


def test_a_missing_bytecode_hook_turns_trace_once_off_with_a_warning(monkeypatch, caplog):
    _hide(monkeypatch, "torch._dynamo.convert_frame.register_bytecode_hook")
    path = paths_by_name()["trace once"]
    assert not path.on and path.degraded and "register_bytecode_hook" in path.why
    with caplog.at_level(logging.INFO, logger="mini_vllm.compat"):
        compat.log_fast_paths("a kernels phrase only this test logs")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "trace once" in warnings[0].getMessage()


def test_without_the_bytecode_hook_a_compiled_model_still_runs_right(monkeypatch):
    """Trace once needs the hook; without it Dynamo checks its guards on every call, and
    the answers are the eager model's."""
    from mini_vllm.compilation.decorators import TorchCompileWrapper

    monkeypatch.setattr(compat, "register_bytecode_hook", lambda hook: None)
    wrapper = TorchCompileWrapper(_Doubler(), CompilationMode.DYNAMO_TRACE_ONCE)
    assert wrapper._hook is None
    for rows in (3, 5, 3):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(wrapper(x), 2 * x + 1)


class _Doubler(torch.nn.Module):
    """The smallest model the compile wrapper accepts."""

    _dynamic_arg_dims = {"x": 0}
    _supports_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1


class _FakeRun:
    launch = staticmethod(lambda *args: None)
    launch_cooperative_grid = False
    launch_pdl = False
    global_scratch_size = 0
    profile_scratch_size = 0

    def __call__(self, *args):
        pass


def _fake_compiled():
    return types.SimpleNamespace(run=_FakeRun(), function=1, packed_metadata=())


@pytest.mark.parametrize("version, direct", [("3.6.0", True), ("3.7.1", False), ("3.5.1", False)])
def test_only_a_checked_triton_is_launched_past_its_front_end(monkeypatch, version, direct):
    monkeypatch.setattr(compat, "triton", lambda: types.SimpleNamespace(__version__=version))
    parts = compat.launch_parts(_fake_compiled())
    assert (parts is not None) is direct
    if direct:
        assert parts.bare is _FakeRun.launch  # no scratch memory: the C function itself


def test_a_kernel_that_needs_scratch_memory_keeps_tritons_wrapper(monkeypatch):
    monkeypatch.setattr(compat, "triton", lambda: types.SimpleNamespace(__version__="3.6.0"))
    compiled = _fake_compiled()
    compiled.run.global_scratch_size = 128
    parts = compat.launch_parts(compiled)
    assert parts is not None and parts.bare is None


def test_the_launch_cache_tells_devices_apart(monkeypatch):
    """A kernel compiled for one GPU is never launched on another through the kept launcher."""
    from mini_vllm.kernels import launch

    device = [0]
    front_end_calls, direct_calls = [], []

    class Kernel:
        constexprs = [1]

        def __getitem__(self, grid):
            def run(*args, **options):
                front_end_calls.append(device[0])
                return _fake_compiled()

            return run

    monkeypatch.setattr(compat, "triton", lambda: types.SimpleNamespace(__version__="3.6.0"))
    monkeypatch.setattr(launch, "_current_device", lambda: device[0])
    monkeypatch.setattr(compat, "raw_stream_getters", lambda: (lambda index: 0, lambda: device[0]))
    monkeypatch.setattr(
        _FakeRun, "launch", staticmethod(lambda *args: direct_calls.append(device[0]))
    )
    kernel = Kernel()
    for gpu in (0, 0, 1, 1, 0):
        device[0] = gpu
        launch.launch(kernel, (1,), 7, 64)
    assert front_end_calls == [0, 1]  # once a device
    assert direct_calls == [0, 1, 0]


def test_a_saved_model_whose_backend_result_moved_is_compiled_again(tmp_path, monkeypatch, caplog):
    """A torch that keeps the compiled backend's result elsewhere than compat reads it: the
    warm start warns and compiles again instead of crashing."""
    from mini_vllm.compilation.caching import aot_cache

    saved = tmp_path / "model.compiled"
    saved.write_bytes(b"not read")
    loaded = types.SimpleNamespace(
        source_info=lambda: types.SimpleNamespace(inlined_sources=[]),
        disable_guard_check=lambda: None,
    )  # no `_artifacts`
    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda *a, **k: loaded)
    with caplog.at_level(logging.WARNING, logger="mini_vllm.compilation.caching.aot_cache"):
        assert aot_cache.load_compiled_model(saved, {}) is None
    assert "compiling it again" in caplog.text


def test_the_fusion_passes_refuse_to_run_where_op_names_do_not_resolve(monkeypatch):
    from mini_vllm.compilation.passes import fusion

    monkeypatch.setattr(compat, "op_names_resolve", lambda: False)
    with pytest.raises(RuntimeError, match="enable_fusion=False"):
        fusion.run_fusion_passes(torch.fx.symbolic_trace(torch.nn.ReLU()))


def test_no_module_but_compat_spells_a_private_torch_or_triton_name():
    """Private names (a part starting with `_`) of torch and triton, in imports and in
    attribute chains, live in mini_vllm/compat.py alone."""
    import ast
    from pathlib import Path

    package = Path(compat.__file__).parent

    def private(dotted: str) -> bool:
        parts = dotted.split(".")
        return parts[0] in ("torch", "triton") and any(
            p.startswith("_") and not p.startswith("__") for p in parts[1:]
        )

    def dotted(node: ast.AST) -> str | None:
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return ".".join([node.id, *reversed(names)])
        return None

    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "compat.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                name = dotted(node)
                names = [name] if name else []
            found += [f"{path.relative_to(package)}:{node.lineno} {n}" for n in names if private(n)]
    assert not found, "private names outside mini_vllm/compat.py:\n" + "\n".join(sorted(found))
