"""Phase 05's one-graph-by-hand example on a GPU (GPU-REQ; the CPU side:
tests/engine/test_cuda_graph_basics.py).

One capture, then one replay per input: each replay gives eager's answer for its own input,
not the previous one's, and the module runs as the chapter says.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mini_vllm.teaching.cuda_graph_basics import make_step, replay_with_graph

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_each_replay_gives_eagers_answer_for_the_input_copied_in():
    torch.manual_seed(0)
    step = make_step(hidden=64, device="cuda")
    inputs = [torch.randn(8, 64, device="cuda") for _ in range(4)]
    eager = [step(x) for x in inputs]
    replayed = replay_with_graph(step, inputs)
    assert len(replayed) == len(inputs)
    for got, want in zip(replayed, eager):
        torch.testing.assert_close(got, want)
    # the inputs differ, so a replay that read a stale input would fail above
    assert not torch.allclose(eager[0], eager[1])
    # the outputs are copies: the graph's own output tensor is not handed out twice
    assert len({t.data_ptr() for t in replayed}) == len(replayed)


@pytest.mark.gpu
def test_the_module_runs_as_the_chapter_says():
    result = subprocess.run(
        [sys.executable, "-m", "mini_vllm.teaching.cuda_graph_basics"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "one capture, 4 replays" in result.stdout
