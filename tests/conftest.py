"""The repository's test suite, in three tiers, and the fixtures they share.

- tests/engine/: the package's own tests (engine, scheduler, layers, the kernels' CPU
  side, compilation, CUDA-graph runner, server, CLI). Tests parametrised over devices
  stay here whole: their CUDA case is marked `gpu` and skips, with the reason, on a
  machine without one.
- tests/course/: the course's checks: the book and its pages, the cheat sheet, the
  figures, the notebooks, the scripts, the labs' meta-tests and planted mistakes
  (tests/course/lab_checks/), the grader, the GPU-REQ marker itself.
- tests/gpu/: GPU-REQ files, every test of which needs an NVIDIA GPU (the Triton kernels,
  the model on CUDA, the CUDA side of a CPU file `test_x.py` in `test_x_cuda.py`).
  Elsewhere each skips with the reason.

The folders are packages, so a GPU file imports the helpers of its CPU file
(`from tests.engine.test_x import ...`) instead of copying them. Commands:

    python3 scripts/bootstrap.py test             # the whole suite (pytest -n 2 over tests/)
    pytest tests/engine                           # the quick loop while changing the engine
    make test-fast                                # the same, -n 2, without the real weights
    pytest tests/course                           # the book, labs, notebooks and scripts
    pytest tests -m gpu --require-gpu             # on a GPU machine: every GPU-REQ test,
                                                  # tests/gpu/ and the engine's CUDA cases

Fixtures: models loaded once per test process. Loading SmolLM2 and transformers'
reference takes seconds, so each is a session fixture: every pytest-xdist worker loads
them at most once, and only if one of its tests asks. Tests that use the real weights are
marked `real_weights`; when the weights package is missing they FAIL with the install
command (CI installs it), they do not skip.
"""

from __future__ import annotations

import pytest
import torch


def _fail_without_weights(exc: Exception) -> None:
    pytest.fail(f"real weights unavailable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer, config) of SmolLM2-135M-Instruct on CPU, float32."""
    from mini_vllm.errors import MissingWeightsError
    from mini_vllm.models.loader import load_model

    try:
        return load_model(
            "smollm2-135m-instruct", device="cpu", dtype=torch.float32, progress=False
        )
    except MissingWeightsError as exc:
        _fail_without_weights(exc)


@pytest.fixture(scope="session")
def hf_reference():
    """(transformers LlamaForCausalLM, transformers
    tokenizer), both read from the same GGUF, float32.

    The independent reference: transformers dequantizes and un-permutes the GGUF
    with its own code (transformers/modeling_gguf_pytorch_utils.py).
    """
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM

    from mini_vllm.errors import MissingWeightsError
    from mini_vllm.weights.gguf_file import find_smollm2_gguf

    try:
        gguf_path = find_smollm2_gguf()
    except MissingWeightsError as exc:
        _fail_without_weights(exc)
    transformers.logging.set_verbosity_error()
    folder, name = str(gguf_path.parent), gguf_path.name
    model = LlamaForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer


@pytest.fixture(scope="session")
def tiny():
    """(model, None, config): the `tiny` shape with seed-0 random weights, CPU float32."""
    from mini_vllm.models.loader import load_model

    return load_model("tiny", device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(autouse=True)
def fresh_capture_window():
    """Each test starts with the capture window open, as a fresh process does.

    The window is process-wide, as in vLLM: an engine built by an earlier test in the
    same worker closes it at the end of its start-up, and a test that drives a wrapper
    by hand would otherwise be refused its first capture.
    """
    from mini_vllm.compilation.monitor import (
        cudagraph_capturing_enabled,
        set_cudagraph_capturing_enabled,
    )

    before = cudagraph_capturing_enabled()
    set_cudagraph_capturing_enabled(True)
    yield
    set_cudagraph_capturing_enabled(before)
