"""Tensor parallelism under torchrun (`distributed_executor_backend="external_launcher"`):
two gloo ranks started by `torch.distributed.run`, each running the whole engine on the
same prompts, give the one-rank engine's tokens on both ranks; a rank whose script goes
another way is an error on both within seconds; a run without a launcher is refused with
the command to use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(20, 60)), [100] * 17]
GREEDY = dict(temperature=0, max_tokens=12, logprobs=2)

# Each rank runs this; it writes what it generated (or the error it met) to OUT/rank<r>.json.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from mini_vllm import LLM, SamplingParams

    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    prompts = {prompts!r}
    params = {greedy!r}
    if mode == "sampled":  # unseeded draws: each rank's own random state
        params = dict(params, temperature=0.8)
    if mode == "diverge" and rank == 1:
        prompts = [[3, 3, 3]] + prompts[1:]  # this rank's script went another way
    if mode == "same-length" and rank == 1:
        prompts = [[9, 9, 9, 9, 9]] + prompts[1:]  # another prompt of the same length
    graphs = {{}}
    if mode == "ladder":  # this rank's script asks for other graphs than the other's
        graphs = dict(cudagraph_mode="full_and_piecewise",
                      cudagraph_capture_sizes=[1, 2, 4] if rank == 1 else [1, 2, 4, 8])
    try:
        llm = LLM("tiny", dtype="float32", max_num_seqs=4, tensor_parallel_size=2,
                  distributed_executor_backend="external_launcher", **graphs)
        outputs = llm.generate(prompts, SamplingParams(**params), use_tqdm=False)
        result = {{"tokens": [o.token_ids for o in outputs],
                   "logprobs": [[e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.token_ids)]
                                for o in outputs]}}
    except Exception as exc:
        result = {{"error": str(exc)}}
    with open(os.path.join(out, f"rank{{rank}}.json"), "w") as f:
        json.dump(result, f)
    sys.exit(1 if "error" in result else 0)
    """
).format(prompts=PROMPTS, greedy=GREEDY)


def torchrun(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), str(tmp_path), mode]
    env = {**os.environ, "MINI_VLLM_TP_TIMEOUT_S": "15", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    results = []
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing:\n{done.stderr[-3000:]}"
        results.append(json.loads(path.read_text()))
    return done, results, seconds


def test_two_ranks_under_torchrun_give_the_one_rank_tokens_on_both_ranks(tmp_path):
    reference = LLM("tiny", dtype="float32", max_num_seqs=4).generate(
        PROMPTS, SamplingParams(**GREEDY), use_tqdm=False
    )
    done, results, _ = torchrun(tmp_path, "same")
    assert done.returncode == 0, done.stderr[-3000:]
    for rank, result in enumerate(results):
        assert result["tokens"] == [o.token_ids for o in reference], f"rank {rank}"
        expected = [
            [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.token_ids)] for o in reference
        ]
        for got, want in zip(result["logprobs"], expected):
            assert got == pytest.approx(want, abs=1e-5), f"rank {rank}"


def test_unseeded_sampling_draws_the_same_tokens_on_every_rank(tmp_path):
    done, results, _ = torchrun(tmp_path, "sampled")
    assert done.returncode == 0, [r.get("error") for r in results]
    assert results[0]["tokens"] == results[1]["tokens"]


def test_a_rank_whose_script_diverges_is_an_error_on_every_rank_not_a_hang(tmp_path):
    done, results, seconds = torchrun(tmp_path, "diverge")
    assert done.returncode != 0
    for rank, result in enumerate(results):
        assert "scheduled another step than some other rank" in result.get("error", ""), (
            f"rank {rank}: {result}"
        )
        assert "same requests, in the same order" in result["error"]
    assert seconds < 120  # start-up included; the disagreement itself is caught at once


def test_a_rank_whose_prompt_differs_only_in_its_tokens_is_an_error_not_garbage(tmp_path):
    # Same shapes on both ranks: only the token ids tell the two schedules apart.
    done, results, _ = torchrun(tmp_path, "same-length")
    assert done.returncode != 0
    for rank, result in enumerate(results):
        assert "scheduled another step than some other rank" in result.get("error", ""), (
            f"rank {rank}: {result}"
        )


def test_ranks_that_would_capture_other_graphs_fail_at_start_naming_both(tmp_path):
    done, results, seconds = torchrun(tmp_path, "ladder")
    assert done.returncode != 0
    for rank, result in enumerate(results):
        error = result.get("error", "")
        assert "the ranks disagree on the graphs to capture" in error, f"rank {rank}: {result}"
        assert "rank 0 has" in error and "rank 1 has" in error
    assert seconds < 120  # start-up included; the check is one gather before any capture


def test_the_launcher_backend_without_a_launcher_says_how_to_launch(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="torchrun --nproc-per-node 2"):
        EngineConfig(
            model="tiny", tensor_parallel_size=2, distributed_executor_backend="external_launcher"
        )


def test_a_launcher_with_another_number_of_ranks_is_refused(monkeypatch):
    launcher = dict(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    for name, value in {**launcher, "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="started 4 processes but tensor_parallel_size is 2"):
        EngineConfig(
            model="tiny", tensor_parallel_size=2, distributed_executor_backend="external_launcher"
        )


def test_an_unknown_executor_backend_is_refused():
    with pytest.raises(UserError, match="mp, external_launcher"):
        EngineConfig(model="tiny", distributed_executor_backend="ray")
