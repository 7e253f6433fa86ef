"""The memory a CUDA-graph capture reports (GPU-REQ; the runner on both graph backends:
tests/engine/test_cudagraph_runner.py).

The graph memory in the capture report is what the graph pool holds, even when another
part of the process frees memory in the middle of the capture.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_cudagraph_runner import make_llm


@pytest.mark.gpu
def test_graph_memory_counts_the_graph_pool_whatever_else_is_freed(monkeypatch):
    # Memory another part of the process frees during capture (compilation, an engine
    # dropped before) made "free before minus free after" negative; the pool's own
    # segments cannot be moved by it.
    from mini_vllm.compilation.graph_backend import CUDAGraphBackend

    ballast = [torch.empty(2**30, dtype=torch.uint8, device="cuda")]
    original = CUDAGraphBackend.capture

    def capture_and_free(self, *args, **kwargs):
        if ballast:
            ballast.clear()
            torch.cuda.empty_cache()  # 1 GiB back to the device in the middle of capture
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CUDAGraphBackend, "capture", capture_and_free)
    llm = make_llm("cuda", cudagraph_mode="full_and_piecewise")
    runner = llm.engine.runner
    memory = runner.capture_report.graph_memory_bytes
    assert not ballast, "the ballast was never freed: the test checks nothing"
    pool = tuple(runner.graph_pool)
    in_pool = sum(
        s["total_size"]
        for s in torch.cuda.memory_snapshot()
        if tuple(s.get("segment_pool_id", ())) == pool
    )
    assert 0 < memory == in_pool < 2**30
