"""Tensor parallelism on the CPU: two gloo ranks give the one-rank engine's results, and a
rank that dies or falls out of step is an error within seconds, never a hang.

Every test here spawns processes (one a rank); together they take well under two minutes
on two cores. The `tiny` model (4 heads, 2 KV heads) divides by 2.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as torch_mp
from torch.testing import assert_close

from mini_vllm import LLM, SamplingParams
from mini_vllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
    patch_tensor_parallel_group,
)
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from mini_vllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from mini_vllm.models.config import get_model_config

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(20, 60)), [100] * 17]
GREEDY = SamplingParams(temperature=0, max_tokens=12, logprobs=3)
# One request also asks for prompt log-probabilities (every rank joins the LM head's gather
# for them) and penalties (their counts live on rank 0, which alone samples).
PENALISED = SamplingParams(
    temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2, presence_penalty=0.7,
    repetition_penalty=1.3,
)  # fmt: skip
PARAMS = [GREEDY, PENALISED, GREEDY, GREEDY]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _worker_pids(llm: LLM) -> list[int]:
    return [w.process.pid for w in llm.engine.model_executor.workers]


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


# -- each parallel layer against its unsharded self, on two gloo ranks ------------------


def _whole_and_shard(make):
    """The same layer built for one rank (the whole matrix) and for this rank's shard."""
    with patch_tensor_parallel_group(GroupCoordinator.single()):
        whole = make()
    return whole, make()


def _load(layers, tensor, shard_id=None):
    for layer in layers:
        layer.weight.weight_loader(layer.weight, tensor, shard_id)


def _check_layers(rank: int, init_file: str) -> None:
    init_distributed_environment(2, rank, f"file://{init_file}", "gloo", 30)
    initialize_model_parallel(2)
    try:
        g = torch.Generator().manual_seed(0)  # the same numbers on both ranks
        x = torch.randn(5, 16, generator=g)

        pair = _whole_and_shard(lambda: ColumnParallelLinear(16, 12))
        _load(pair, torch.randn(12, 16, generator=g))
        assert_close(pair[1](x), pair[0](x)[:, 6 * rank : 6 * (rank + 1)])
        gathered = _whole_and_shard(lambda: ColumnParallelLinear(16, 12, gather_output=True))
        _load(gathered, pair[0].weight.data.clone())
        assert_close(gathered[1](x), gathered[0](x))

        pair = _whole_and_shard(lambda: RowParallelLinear(12, 16))
        _load(pair, torch.randn(16, 12, generator=g))
        x12 = torch.randn(5, 12, generator=g)
        assert_close(pair[1](x12[:, 6 * rank : 6 * (rank + 1)]), pair[0](x12), atol=1e-5, rtol=0)

        pair = _whole_and_shard(lambda: MergedColumnParallelLinear(16, [8, 8]))
        gate, up = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        _load(pair, gate, 0)
        _load(pair, up, 1)
        whole = pair[0](x)
        mine = slice(4 * rank, 4 * (rank + 1))
        assert_close(pair[1](x), torch.cat([whole[:, :8][:, mine], whole[:, 8:][:, mine]], -1))

        # KV heads split (4 heads, 2 KV heads) and replicated (4 heads, 1 KV head).
        for kv_heads in (2, 1):
            pair = _whole_and_shard(lambda kv=kv_heads: QKVParallelLinear(16, 2, 4, kv))
            for shard_id, rows in (("q", 8), ("k", 2 * kv_heads), ("v", 2 * kv_heads)):
                _load(pair, torch.randn(rows, 16, generator=g), shard_id)
            whole, shard = pair[0](x), pair[1](x)
            q, k, v = whole.split([8, 2 * kv_heads, 2 * kv_heads], -1)
            kv_rank = rank if kv_heads == 2 else 0  # one KV head: both ranks hold it
            expected = [q[:, 4 * rank : 4 * rank + 4], k[:, 2 * kv_rank : 2 * kv_rank + 2]]
            expected.append(v[:, 2 * kv_rank : 2 * kv_rank + 2])
            assert pair[1].num_kv_head_replicas == (1 if kv_heads == 2 else 2)
            assert_close(shard, torch.cat(expected, -1))

        # A vocabulary of 11 ids: rank 1's shard has a padding row.
        table = torch.randn(11, 16, generator=g)
        pair = _whole_and_shard(lambda: VocabParallelEmbedding(11, 16))
        _load(pair, table)
        ids = torch.tensor([0, 5, 6, 10, 3, 10])
        assert_close(pair[1](ids), pair[0](ids))
        pair = _whole_and_shard(lambda: ParallelLMHead(11, 16))
        _load(pair, table)
        assert_close(pair[1](x), pair[0](x), atol=1e-5, rtol=0)
        assert pair[1](x).shape == (5, 11)
    finally:
        destroy_distributed_environment()


def test_each_parallel_layer_equals_its_unsharded_version_on_two_ranks(tmp_path):
    torch_mp.spawn(_check_layers, args=(str(tmp_path / "rendezvous"),), nprocs=2, join=True)


# -- the engine ---------------------------------------------------------------------------


def _tokens_and_logprobs(llm: LLM):
    outputs = llm.generate(PROMPTS, PARAMS)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logprobs = [
        [value.logprob for step in o.outputs[0].logprobs for value in step.values()]
        for o in outputs
    ]
    prompt = outputs[1].prompt_logprobs
    logprobs.append([v.logprob for step in prompt[1:] for v in step.values()])
    return tokens, logprobs


# On the CPU, "graphs" are mini_vllm's CPU look-alike (compilation/cpu_graph.py): it records
# the all-reduce op at capture and runs it again, a collective, at every replay.
@pytest.mark.parametrize("graphs", [{}, {"cudagraph_mode": "full_and_piecewise"}], ids=str)
def test_two_ranks_give_the_one_rank_tokens_and_logprobs_and_leave_no_process(graphs):
    reference = _tokens_and_logprobs(LLM("tiny", dtype="float32", max_num_seqs=4))
    llm = LLM("tiny", dtype="float32", max_num_seqs=4, tensor_parallel_size=2, **graphs)
    pids = _worker_pids(llm)
    assert len(pids) == 1 and all(_alive(pid) for pid in pids)
    tokens, logprobs = _tokens_and_logprobs(llm)
    assert tokens == reference[0]
    for got, expected in zip(logprobs, reference[1]):
        assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=0)
    if graphs:  # the decode steps replayed graphs: FULL ones, their all-reduces inside
        assert llm.engine.runner.capture_report.num_graphs > 0
        assert llm.engine.stats.steps_per_runtime_mode["FULL"] > 0
    # The engine's rank 0 holds half the model.
    attn = llm.engine.runner.model.model.layers[0].self_attn.attn
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    del llm
    gc.collect()
    assert _gone_within(pids, 10), "a tensor-parallel worker outlived its LLM"


def test_a_rank_that_dies_is_an_error_naming_it_within_seconds(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_TP_TIMEOUT_S", "5")
    llm = LLM("tiny", max_num_seqs=4, tensor_parallel_size=2)
    [pid] = _worker_pids(llm)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    # The message keeps what failed (rank 0's step) before why (rank 1 died).
    with pytest.raises(RuntimeError, match=r"parallelism: rank 0 failed .*rank 1 .*exit code -9"):
        llm.generate(PROMPTS, GREEDY)
    assert time.monotonic() - start < 8
    with pytest.raises(RuntimeError, match="delete this LLM"):  # and stays refused
        llm.generate(PROMPTS[:1], GREEDY)


def test_a_rank_that_skips_a_step_is_a_timeout_error_not_a_hang(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_TP_TIMEOUT_S", "3")
    llm = LLM("tiny", max_num_seqs=4, tensor_parallel_size=2)
    pids = _worker_pids(llm)
    executor = llm.engine.model_executor
    # Rank 1 never hears of the next step: rank 0 runs its forward alone.
    monkeypatch.setattr(executor, "_broadcast", lambda method, args: None)
    start = time.monotonic()
    with pytest.raises(
        RuntimeError, match="parallelism: rank 0 failed .*ranks disagree on the step"
    ):
        llm.generate(PROMPTS, GREEDY)
    assert time.monotonic() - start < 10
    assert _gone_within(pids, 10), "the workers of a failed engine must end"


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tensor_parallel_size": 0}, "from 1 to 8"),
        ({"tensor_parallel_size": 9}, "from 1 to 8"),
        ({"tensor_parallel_size": "2"}, "from 1 to 8"),
        ({"tensor_parallel_size": 2, "async_scheduling": True}, "async_scheduling"),
        ({"tensor_parallel_size": (os.cpu_count() or 1) + 1}, "core a rank|from 1 to 8"),
    ],
)
def test_a_bad_tensor_parallel_size_is_refused_before_anything_starts(kwargs, message):
    with pytest.raises(UserError, match=message):
        EngineConfig(model="tiny", **kwargs)


def test_heads_that_do_not_divide_are_refused():
    config = EngineConfig(model="tiny", tensor_parallel_size=1)
    config.tensor_parallel_size = 3  # as if the machine had the cores
    with pytest.raises(UserError, match=r"does not divide its 4 attention heads"):
        config.check_tensor_parallel(get_model_config("tiny"))
    smollm2 = get_model_config("smollm2-135m")  # 9 heads, 3 KV heads
    config.check_tensor_parallel(smollm2)


def test_from_model_refuses_tensor_parallelism():
    with pytest.raises(UserError, match="tensor_parallel_size=N"):
        LLM.from_model(torch.nn.Linear(1, 1), tensor_parallel_size=2)


def test_the_all_reduce_is_one_op_a_trace_keeps_and_never_runs():
    from torch.fx.experimental.proxy_tensor import make_fx

    import mini_vllm.distributed.parallel_state  # noqa: F401  (registers the op)

    graph = make_fx(lambda x: torch.ops.mini_vllm.all_reduce(x, "tp") * 2, tracing_mode="fake")(
        torch.ones(3, 4)
    )
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert "mini_vllm.all_reduce.default" in targets


def test_the_kv_cache_plan_counts_a_ranks_share_of_the_kv_heads():
    """Each rank caches its own KV heads (tiny: 2, so one a rank at TP=2): a block costs half
    the bytes, and the same memory holds twice the blocks."""
    from mini_vllm.engine.engine_config import EngineConfig
    from mini_vllm.engine.kv_cache_plan import plan_kv_cache
    from mini_vllm.models.loader import load_model_config

    model_config = load_model_config("tiny")
    plans = [
        plan_kv_cache(
            EngineConfig(model="tiny", tensor_parallel_size=tp, kv_cache_memory_bytes=1 << 22),
            model_config,
            torch.float32,
            torch.device("cpu"),
        )
        for tp in (1, 2)
    ]
    assert plans[1].bytes_per_block * 2 == plans[0].bytes_per_block
    assert plans[1].num_blocks == 2 * plans[0].num_blocks


def test_a_script_without_a_main_guard_fails_at_once_naming_the_rank(tmp_path):
    """Spawned ranks import the user's script again; without `if __name__ == "__main__":` the
    worker dies before it joins the group, which rank 0 must report, not wait out."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        'from mini_vllm import LLM\nLLM("tiny", max_num_seqs=4, tensor_parallel_size=2)\n'
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "rank 1 failed while starting" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - start < 60  # not the rendezvous' 300 s
