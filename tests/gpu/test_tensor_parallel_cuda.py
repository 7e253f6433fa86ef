"""Tensor parallelism on two GPUs with CUDA graphs (GPU-REQ, and two GPUs; the CPU tests:
tests/engine/test_tensor_parallel.py).

Two ranks on NCCL, each replaying its own graphs with the all-reduces captured inside, give
the one-GPU engine's tokens and log-probabilities; a worker that dies while the graphs run is
an error on rank 0 within seconds, not a kernel that waits for ever.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from mini_vllm import LLM, SamplingParams
from tests.engine.test_tensor_parallel import PROMPTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.device_count() < 2,
        reason="needs two NVIDIA GPUs (tensor_parallel_size=2)",
    ),
]
GREEDY = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)


def _run(llm: LLM) -> tuple[list, list]:
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logprobs = [[e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.token_ids)] for o in outputs]
    return tokens, logprobs


@pytest.fixture(scope="module")
def one_gpu():
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, enforce_eager=True)
    yield _run(llm)
    del llm


@pytest.mark.parametrize(
    "options",
    [
        {"cudagraph_mode": "full_and_piecewise", "compilation_mode": "none"},
        {"cudagraph_mode": "full_and_piecewise", "compilation_mode": "vllm_compile"},
    ],
    ids=["graphs", "compiled-graphs"],
)
def test_two_gpus_with_graphs_give_the_one_gpu_tokens(options, one_gpu):
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=2,
              **options)  # fmt: skip
    tokens, logprobs = _run(llm)
    assert tokens == one_gpu[0]
    worst = max(abs(a - b) for x, y in zip(logprobs, one_gpu[1]) for a, b in zip(x, y))
    assert worst < 1e-4
    modes = llm.engine.stats.steps_per_runtime_mode
    assert modes["FULL"] > 0, modes  # the decode steps replayed graphs on both ranks
    del llm


def test_a_worker_killed_while_graphs_replay_is_an_error_within_seconds(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_TP_TIMEOUT_S", "10")
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=2,
              cudagraph_mode="full_and_piecewise", compilation_mode="none")  # fmt: skip
    executor = llm.engine.model_executor
    worker = executor.workers[0]
    broadcast, steps, killed = executor._broadcast, [], {}

    def broadcast_then_kill(method, args):
        broadcast(method, args)
        steps.append(method)
        if len(steps) == 4:  # a decode step: rank 0 is about to replay a FULL graph
            os.kill(worker.process.pid, signal.SIGKILL)
            worker.process.join(5)
            killed["at"] = time.monotonic()

    monkeypatch.setattr(executor, "_broadcast", broadcast_then_kill)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    with pytest.raises(RuntimeError, match=r"rank 1 .*(died|exit code)"):
        llm.generate([[1, 2, 3]] * 4, params, use_tqdm=False)
    assert time.monotonic() - killed["at"] < 5
    with pytest.raises(RuntimeError, match="delete this LLM"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
