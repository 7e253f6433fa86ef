"""Phase 07, lab 02 — agreement: checks and agreements between tensor-parallel ranks.

Most tests run on real ranks: two (or three) processes forked from this one, joined in a
gloo process group whose collectives give up after TIMEOUT_S, each running the same test
code on its own `TPGroup`. A test reads what every rank returned or raised, so it can
require what matters here: that every rank reaches the same verdict. A rank that waits
for a partner who went another way ends in gloo's error (or, when the two calls disagree
on their sizes, gloo ends its process), never in a hang; a rank that has not finished
after DEADLINE_S is killed and reported.

Shapes are tiny and starting the ranks takes a fraction of a second, so the lab runs in
seconds.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from labkit import implementation
from labpredict import check_predictions
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
)
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import Sequence
from mini_vllm.executor.external_launcher import schedule_fingerprint as engine_fingerprint

impl = implementation(
    __file__, starter="agreement.py", reference="tests.course.lab_checks.phase07_lab02_reference"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase07_lab02_answers"
)

ROOT = Path(__file__).resolve().parents[4]
# Forked ranks share this process's modules (your starter as loaded here); where fork is
# missing (Windows) or unsafe with torch (macOS), each rank starts afresh.
START = "fork" if sys.platform == "linux" else "spawn"
TIMEOUT_S = 10  # a collective that some rank never joins raises after this long
DEADLINE_S = 60  # a rank still running after this long is killed

# --- ranks ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one rank's run ended with."""

    rank: int
    value: object = None
    error: str | None = None  # the exception's type name; "lost" if the rank left no word
    message: str = ""

    def __str__(self) -> str:
        if self.error is None:
            return f"rank {self.rank} returned {self.value!r}"
        return f"rank {self.rank} {self.error}: {self.message[:400]}"


def _rank_main(rank: int, world_size: int, init_file: str, out_dir: str, fn, args) -> None:
    torch.set_num_threads(1)  # the ranks share the cores
    outcome = Outcome(rank)
    try:
        init_distributed_environment(world_size, rank, f"file://{init_file}", "gloo", TIMEOUT_S)
        initialize_model_parallel(world_size)
        group = impl.TPGroup(world_size, rank, get_tp_group().cpu_group)
        outcome.value = fn(group, *args)
    except BaseException as exc:  # the test reads it: every rank's verdict matters
        outcome.error, outcome.message = type(exc).__name__, str(exc)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(outcome, f)
    destroy_distributed_environment()


def on_ranks(fn, *args, world_size: int = 2) -> list[Outcome]:
    """Run `fn(group, *args)` on `world_size` gloo ranks, one process each; what each
    rank returned or raised, in rank order."""
    context = mp.get_context(START)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [
            context.Process(target=_rank_main, args=(r, world_size, init, tmp, fn, args))
            for r in range(world_size)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        outcomes = []
        for rank, proc in enumerate(procs):
            path = os.path.join(tmp, f"rank{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    outcomes.append(pickle.load(f))
            else:
                outcomes.append(
                    Outcome(rank, error="lost", message=f"ended with exit code {proc.exitcode}")
                )
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    return "\n".join(str(o) for o in outcomes)


def values_of(outcomes: list[Outcome]) -> list:
    """What every rank returned; fails naming each rank that raised instead."""
    failed = [o for o in outcomes if o.error is not None]
    assert not failed, "a rank raised where every rank should return:\n" + report(outcomes)
    return [o.value for o in outcomes]


_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
)


@contextlib.contextmanager
def counting_collectives(calls: list[str]):
    """Record, in `calls`, every torch.distributed collective this process starts (one
    entry a call the code makes, not the calls a collective makes inside)."""
    depth = [0]
    saved = []

    def counted(name, original):
        def call(*args, **kwargs):
            if depth[0] == 0:
                calls.append(name)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for module in (dist, dist.distributed_c10d):
        for name in _COLLECTIVES:
            original = getattr(module, name, None)
            if original is not None:
                saved.append((module, name, original))
                setattr(module, name, counted(name, original))
    try:
        yield calls
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


# --- schedules -----------------------------------------------------------------------------


def row(seq_id, cached: int, new_ids, blocks=(0, 1)) -> ScheduledSequence:
    """A scheduled row: request `seq_id`, `cached` tokens in the cache, fed `new_ids`."""
    new_ids = tuple(new_ids)
    seq = Sequence(seq_id, [5] * cached + list(new_ids))
    return ScheduledSequence(seq, len(new_ids), cached, new_ids, tuple(blocks), cached == 0, True)


def step(*rows: ScheduledSequence) -> SchedulerOutput:
    return SchedulerOutput(0, tuple(rows), 16)


def from_spec(spec) -> SchedulerOutput:
    return step(*(row(s, c, n, b) for s, c, n, b in spec))


# A decode of two requests; the cases below change one thing each.
BASE = [("req-a", 7, [42], [0, 1]), ("req-b", 3, [17], [2])]
OTHER_STEPS = {
    "rows in the other order": [BASE[1], BASE[0]],
    "another request id": [("req-c", 7, [42], [0, 1]), BASE[1]],
    "another cached count": [("req-a", 6, [42], [0, 1]), BASE[1]],
    "another token fed": [("req-a", 7, [43], [0, 1]), BASE[1]],
    "a token moved between rows": [("req-a", 7, [42, 9], [0, 1]), ("req-b", 3, [], [2])],
    "a row dropped": [BASE[0]],
}


# --- the README's scenarios, built on the reference -----------------------------------------

LADDERS = ([1, 2, 4, 8], [1, 2, 8])  # rank 0's, rank 1's
MAX_NUM_SEQS = 8


def ladder_dispatchers() -> list[CudagraphDispatcher]:
    return [CudagraphDispatcher("full_and_piecewise", s, MAX_NUM_SEQS) for s in LADDERS]


def dispatcher() -> CudagraphDispatcher:
    return CudagraphDispatcher("full_and_piecewise", [1, 2, 4, 8], MAX_NUM_SEQS)


def hash_in_a_fresh_python(env: dict) -> str:
    code = "print(hash(('req-7', 1, 12)))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- step 1: check_same --------------------------------------------------------------------

WHAT = "the capture ladder"


def _check(group, values, then_capture: bool = False):
    impl.check_same(group, WHAT, values[group.rank_in_group])
    if then_capture:  # the first warm-up of the capture that follows the check
        x = torch.ones(values[group.rank_in_group][-1], 4)
        dist.all_reduce(x, group=group.cpu_group)
        return "captured"
    return None


def named_ranks(message: str, values: list) -> dict[int, bool]:
    """{rank named as `rank R has ...`: whether the value shown is that rank's}."""
    named = {}
    for found in re.finditer(r"rank (\d+) has ", message):
        rank = int(found.group(1))
        shown = message[found.end() : found.end() + 40]
        named[rank] = rank < len(values) and shown.startswith(repr(values[rank])[:40])
    return named


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes():
    ranks = ladder_dispatchers()
    keys = [[k.num_tokens for _, k in d.all_keys()] for d in ranks]
    first = next(i for i, (a, b) in enumerate(zip(*keys)) if a != b) + 1
    check_predictions(
        answers,
        {
            "GRAPHS_EACH_RANK_CAPTURES": [len(d.all_keys()) for d in ranks],
            "ROWS_OF_A_DECODE_OF_3": [d.dispatch(3, True)[1].num_tokens for d in ranks],
            "ROWS_OF_A_DECODE_OF_5": [d.dispatch(5, True)[1].num_tokens for d in ranks],
            "FIRST_CAPTURE_THAT_DIFFERS": first,
        },
    )


@pytest.mark.step1
def test_ranks_that_hold_equal_values_pass_on_every_rank():
    keys = [(m.name, k) for m, k in dispatcher().all_keys()]
    outcomes = on_ranks(_check, [keys, list(keys)])
    assert values_of(outcomes) == [None, None]


@pytest.mark.step1
def test_values_equal_by_eq_pass_even_when_built_in_another_order():
    # Each rank filled its settings in its own order: equal dicts, other reprs and pickles.
    mine = {"mode": "FULL_AND_PIECEWISE", "sizes": [1, 2, 4, 8], "max_num_seqs": 8}
    theirs = dict(reversed(list(mine.items())))
    assert repr(mine) != repr(theirs) and pickle.dumps(mine) != pickle.dumps(theirs)
    outcomes = on_ranks(_check, [mine, theirs])
    assert values_of(outcomes) == [None, None], (
        "equal values were taken for different ones: compare the values (==), not their "
        "text or their bytes"
    )


@pytest.mark.step1
def test_when_the_ranks_disagree_every_rank_raises_before_the_capture():
    """Your decision: which ranks raise."""
    outcomes = on_ranks(_check, [[1, 2, 4, 8], [1, 2, 4]], True)
    for o in outcomes:
        assert o.error == "RuntimeError" and WHAT in o.message, (
            f"rank {o.rank} did not stop at the check ({o}). Every rank received every "
            "value; a rank that goes on to capture runs its first warm-up's all-reduce and "
            "waits there for a partner that has stopped (here gloo gives up when the other "
            "rank's process ends; with NCCL it may wait for ever).\n" + report(outcomes)
        )


@pytest.mark.step1
def test_the_error_names_what_and_two_ranks_that_hold_different_values():
    values = [[1, 2, 4, 8], [1, 2, 4]]
    outcomes = on_ranks(_check, values)
    for o in outcomes:
        assert o.error == "RuntimeError", report(outcomes)
        assert WHAT in o.message, f"rank {o.rank}'s message does not say what disagrees"
        named = named_ranks(o.message, values)
        assert len(named) >= 2 and all(named.values()), (
            f"rank {o.rank}'s message should show two ranks as `rank R has VALUE`, with "
            f"their own values: {o.message!r}"
        )


SEVERAL = {
    "two ranks": [[1, 2, 4, 8], [1, 2, 4]],
    "three ranks, the last differs": [[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4]],
    "three ranks, rank 0 differs": [[1, 2, 4], [1, 2, 4, 8], [1, 2, 4, 8]],
}


@pytest.mark.step1
@pytest.mark.parametrize("values", SEVERAL.values(), ids=SEVERAL.keys())
def test_every_rank_raises_the_same_message_naming_ranks_that_differ(values):
    """Your decision: what each rank's message says when several ranks differ."""
    outcomes = on_ranks(_check, values, world_size=len(values))
    messages = [o.message for o in outcomes]
    assert all(o.error == "RuntimeError" for o in outcomes), report(outcomes)
    assert len(set(messages)) == 1, (
        "the ranks raised different messages; the logs of N ranks then blame N different "
        "ranks, and a reader cannot tell which one is off. Every rank received the same "
        "values: let every rank compare them the same way.\n" + report(outcomes)
    )
    named = named_ranks(messages[0], values)
    assert all(named.values()) and len({repr(values[r]) for r in named}) >= 2, (
        f"the message should show two ranks that hold different values: {messages[0]!r}"
    )


@pytest.mark.step1
def test_a_long_value_is_cut_so_the_message_stays_readable():
    values = [list(range(3000)), list(range(2999))]
    outcomes = on_ranks(_check, values)
    for o in outcomes:
        assert o.error == "RuntimeError", report(outcomes)
        assert len(o.message) <= 1000, (
            f"rank {o.rank} raised a message of {len(o.message)} characters; cut each "
            "value's repr to 200 characters"
        )
        assert "rank 0 has [0, 1, 2, 3" in o.message or "rank 1 has [0, 1, 2, 3" in o.message


@pytest.mark.step1
def test_a_group_of_one_returns_at_once_without_a_process_group():
    assert not dist.is_initialized()
    # A value that cannot even be pickled: a group of one never sends anything.
    assert impl.check_same(impl.TPGroup.single(), WHAT, lambda: None) is None


# --- step 2: agreed_min --------------------------------------------------------------------


def _min(group, values):
    return impl.agreed_min(group, values[group.rank_in_group])


MINIMA = {
    "rank 1 holds less": (1000, 998),
    "rank 0 holds less": (998, 1000),
    "equal": (4096, 4096),
    "a rank with none": (0, 512),
    "three ranks": (7, 3, 9),
}


@pytest.mark.step2
@pytest.mark.parametrize("values", MINIMA.values(), ids=MINIMA.keys())
def test_every_rank_gets_the_smallest_value_whichever_rank_holds_it(values):
    got = values_of(on_ranks(_min, values, world_size=len(values)))
    assert got == [min(values)] * len(values), f"the ranks held {values} and got {got}"


@pytest.mark.step2
@pytest.mark.parametrize(
    "values", [(2**40 + 5, 2**40 + 3), (2**53 + 3, 2**53 + 1)], ids=["past 2**32", "past 2**53"]
)
def test_counts_past_32_and_53_bits_come_back_exactly(values):
    got = values_of(on_ranks(_min, values))
    assert got == [min(values)] * 2, (
        f"the ranks held {values} and got {got}: a byte count of 1 TiB is past 2**40, and "
        "an int32 overflows and a float64 rounds past 2**53"
    )


@pytest.mark.step2
def test_the_result_is_a_python_int():
    got = values_of(on_ranks(_min, (1000, 998)))
    assert all(type(v) is int for v in got), f"got {[type(v).__name__ for v in got]}"


@pytest.mark.step2
def test_a_group_of_one_returns_its_own_value_without_a_process_group():
    assert not dist.is_initialized()
    assert impl.agreed_min(impl.TPGroup.single(), 2**53 + 1) == 2**53 + 1


# --- step 3: schedule_fingerprint and agree ------------------------------------------------


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # a seed each
    base = from_spec(BASE)
    other_blocks = from_spec([(s, c, n, [b + 10 for b in blocks]) for s, c, n, blocks in BASE])
    check_predictions(
        answers,
        {
            "HASH_SAME_IN_TWO_PROCESSES": hash_in_a_fresh_python(env)
            == hash_in_a_fresh_python(env),
            "FINGERPRINT_CHANGES_WHEN_ROWS_SWAP": engine_fingerprint(base)
            != engine_fingerprint(from_spec(OTHER_STEPS["rows in the other order"])),
            "FINGERPRINT_CHANGES_WITH_BLOCK_TABLES": engine_fingerprint(base)
            != engine_fingerprint(other_blocks),
        },
    )


@pytest.mark.step3
def test_the_same_step_gives_the_same_fingerprint_an_int64_can_carry():
    first = impl.schedule_fingerprint(from_spec(BASE))
    again = impl.schedule_fingerprint(from_spec(BASE))
    assert type(first) is int and first == again, f"{first!r} then {again!r}"
    big = step(*(row(f"req-{i}", 100 + i, [i % 250] * 3) for i in range(300)))
    for fingerprint in (first, impl.schedule_fingerprint(big)):
        assert 0 <= fingerprint < 2**63, (
            f"{fingerprint} does not fit the int64 that carries it to the other ranks"
        )


@pytest.mark.step3
@pytest.mark.parametrize("other", OTHER_STEPS.values(), ids=OTHER_STEPS.keys())
def test_a_step_that_would_run_another_forward_gets_another_fingerprint(other):
    base = impl.schedule_fingerprint(from_spec(BASE))
    assert impl.schedule_fingerprint(from_spec(other)) != base


FINGERPRINT_SCRIPT = """
import importlib.util, json, sys
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import Sequence
spec = importlib.util.spec_from_file_location("lab_agreement", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["lab_agreement"] = module
spec.loader.exec_module(module)
rows = []
for seq_id, cached, new_ids, blocks in json.loads(sys.argv[2]):
    seq = Sequence(seq_id, [5] * cached + new_ids)
    rows.append(ScheduledSequence(seq, len(new_ids), cached, tuple(new_ids), tuple(blocks),
                                  cached == 0, True))
print(module.schedule_fingerprint(SchedulerOutput(0, tuple(rows), 16)))
"""


@pytest.mark.step3
def test_another_process_with_another_hash_seed_computes_the_same_fingerprint():
    """Under torchrun every rank is a fresh Python, with its own seed for str hashes."""
    mine = impl.schedule_fingerprint(from_spec(BASE))
    seed = "1234" if os.environ.get("PYTHONHASHSEED") != "1234" else "4321"
    env = dict(os.environ, PYTHONHASHSEED=seed)
    done = subprocess.run(
        [sys.executable, "-c", FINGERPRINT_SCRIPT, impl.__file__, json.dumps(BASE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = int(done.stdout.split()[-1])
    assert theirs == mine, (
        f"this process computes {mine}, a Python with PYTHONHASHSEED={seed} computes {theirs} "
        "for the same step: two ranks under torchrun would disagree on every step. Python "
        "salts the hash of a str with a seed each process draws; use a checksum of bytes"
    )


def _agree(group, values, counted: bool = False):
    calls: list[str] = []
    with counting_collectives(calls):
        verdict = impl.agree(group, values[group.rank_in_group])
    return (verdict, len(calls)) if counted else verdict


VERDICTS = {
    "equal": ((7, 7), True),
    "the larger on rank 1": ((5, 9), False),
    "the larger on rank 0": ((9, 5), False),
    "equal at the top of a crc32": ((2**32 - 1, 2**32 - 1), True),
    "past 32 bits, one apart": ((2**40, 2**40 + 1), False),
    "zero and the largest": ((0, 2**63 - 1), False),
}


@pytest.mark.step3
@pytest.mark.parametrize(("values", "expected"), VERDICTS.values(), ids=VERDICTS.keys())
def test_every_rank_reaches_the_same_verdict(values, expected):
    """Your decision: which reduction tells every rank whether all values are equal."""
    got = values_of(on_ranks(_agree, values))
    assert got == [expected, expected], (
        f"ranks holding {values} concluded {got}, expected {expected} on both. A rank that "
        "concludes True runs the forward, a rank that concludes False stops: if they differ, "
        "the one that runs waits in its first all-reduce for the one that stopped"
    )


@pytest.mark.step3
def test_three_ranks_whose_values_average_to_the_middle_one_disagree_on_every_rank():
    """Your decision, again: what one collective can tell every rank."""
    got = values_of(on_ranks(_agree, (1, 2, 3), world_size=3))
    assert got == [False, False, False], (
        f"ranks holding 1, 2 and 3 concluded {got}: the sum is 3 times the middle value, so "
        "a sum compared with N times one's own value lets rank 1 run alone"
    )
    got = values_of(on_ranks(_agree, (6, 6, 6), world_size=3))
    assert got == [True, True, True], f"three equal values gave {got}"


@pytest.mark.step3
def test_agreeing_costs_every_rank_exactly_one_collective():
    for values in ((7, 7), (7, 8)):
        got = values_of(on_ranks(_agree, values, True))
        assert [n for _, n in got] == [1, 1], (
            f"{values}: each rank made {[n for _, n in got]} collectives; the check runs "
            "before every forward, so it gets one"
        )


def _lockstep(group, specs):
    """Each rank schedules its own steps; they stop together at the first disagreement."""
    verdicts = []
    for spec in specs[group.rank_in_group]:
        verdicts.append(impl.agree(group, impl.schedule_fingerprint(from_spec(spec))))
        if not verdicts[-1]:
            break
    return verdicts


@pytest.mark.step3
def test_a_rank_whose_script_diverges_is_caught_at_that_step_on_every_rank():
    steps = [
        [("0", 0, [1, 2, 3], [0]), ("1", 0, [7, 8], [1])],
        [("0", 3, [11], [0]), ("1", 2, [12], [1])],
        [("0", 4, [13], [0]), ("1", 3, [14], [1])],
    ]
    # Rank 1's script gave request "1" another prompt of the same length.
    diverged = [steps[0][:1] + [("1", 0, [7, 9], [1])]] + steps[1:]
    got = values_of(on_ranks(_lockstep, [steps, diverged]))
    assert got == [[False], [False]], (
        f"verdicts by step: {got}. The two ranks scheduled rows of the same shapes with "
        "other tokens: their forwards would run and mix the two prompts"
    )
    got = values_of(on_ranks(_lockstep, [steps, steps]))
    assert got == [[True] * 3, [True] * 3], f"identical scripts gave {got}"


# --- step 4: dispatch_together -------------------------------------------------------------


def _dispatch(group, flags, num_tokens=3, uniform_decode=True, forward=False, mode=None):
    d = CudagraphDispatcher(mode or "full_and_piecewise", [1, 2, 4, 8], MAX_NUM_SEQS)
    calls: list[str] = []
    with counting_collectives(calls):
        mode_, key = impl.dispatch_together(
            group, d, num_tokens, uniform_decode, flags[group.rank_in_group]
        )
    result = {"mode": mode_, "key": key, "collectives": calls}
    if forward:  # the forward's first all-reduce, of the rows the key says
        x = torch.ones(key.num_tokens, 8)
        dist.all_reduce(x, group=group.cpu_group)
        result["forward"] = float(x.sum())
    return result


def expected(num_tokens=3, uniform_decode=True, full=True, mode="full_and_piecewise"):
    d = CudagraphDispatcher(mode, [1, 2, 4, 8], MAX_NUM_SEQS)
    return d.dispatch(num_tokens, uniform_decode, disable_full=not full)


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    flags = (True, False)
    alone = [dispatcher().dispatch(3, True, disable_full=not ok) for ok in flags]
    mixed = [dispatcher().dispatch(3, False, disable_full=not ok) for ok in flags]
    check_predictions(
        answers,
        {
            "MODES_OF_A_DECODE_OF_3": [m.name for m, _ in alone],
            "ROWS_OF_THAT_DECODE": [k.num_tokens for _, k in alone],
            "MODES_OF_A_MIXED_STEP_OF_3": [m.name for m, _ in mixed],
        },
    )


@pytest.mark.step4
def test_when_every_rank_may_a_decode_replays_the_full_graph_on_every_rank():
    got = values_of(on_ranks(_dispatch, (True, True)))
    assert [(r["mode"], r["key"]) for r in got] == [expected()] * 2


FLAGS = {
    "rank 1 may not": (True, False),
    "rank 0 may not": (False, True),
    "three ranks, the last may not": (True, True, False),
}


@pytest.mark.step4
@pytest.mark.parametrize("flags", FLAGS.values(), ids=FLAGS.keys())
def test_a_rank_that_may_not_run_a_full_graph_keeps_every_rank_off_it(flags):
    """Your decision: whose flag decides."""
    got = values_of(on_ranks(_dispatch, flags, world_size=len(flags)))
    keys = [(r["mode"], r["key"]) for r in got]
    assert len(set(keys)) == 1, (
        f"with flags {flags} the ranks chose {keys}: one rank replays a FULL graph and another "
        "runs PIECEWISE graphs, two captures whose collectives were never recorded together"
    )
    assert keys[0] == expected(full=False), (
        f"with flags {flags} every rank chose {keys[0]}: a rank that cannot run a FULL graph "
        "was sent to one"
    )


@pytest.mark.step4
@pytest.mark.parametrize("flags", [(True, False), (False, True)], ids=["rank 1", "rank 0"])
def test_the_forward_after_the_dispatch_meets_its_twin_on_every_rank(flags):
    outcomes = on_ranks(_dispatch, flags, 3, True, True)
    got = values_of(outcomes)
    assert [r["forward"] for r in got] == [2.0 * 4 * 8] * 2, (
        "the forward's all-reduce met another collective: " + report(outcomes)
    )


@pytest.mark.step4
def test_every_rank_makes_the_same_collectives_whatever_its_flag():
    outcomes = on_ranks(_dispatch, (True, False))
    got = values_of(outcomes)
    assert got[0]["collectives"] == got[1]["collectives"], (
        f"rank 0 made {got[0]['collectives']}, rank 1 {got[1]['collectives']}: the k-th "
        "collective of one rank meets the k-th of the other, whatever each meant by it"
    )


@pytest.mark.step4
@pytest.mark.parametrize(
    ("num_tokens", "uniform_decode", "mode"),
    [(12, True, None), (3, False, None), (3, True, "piecewise")],
    ids=["a decode above the ladder", "a mixed step", "a PIECEWISE-only engine"],
)
def test_where_the_flag_cannot_matter_every_rank_takes_the_dispatchers_key(
    num_tokens, uniform_decode, mode
):
    got = values_of(on_ranks(_dispatch, (False, True), num_tokens, uniform_decode, False, mode))
    want = expected(num_tokens, uniform_decode, True, mode or "full_and_piecewise")
    assert [(r["mode"], r["key"]) for r in got] == [want] * 2


@pytest.mark.step4
def test_a_group_of_one_follows_its_own_flag_without_a_process_group():
    assert not dist.is_initialized()
    single = impl.TPGroup.single()
    for ok in (True, False):
        got = impl.dispatch_together(single, dispatcher(), 3, True, ok)
        assert got == expected(full=ok), f"full_ok={ok}: {got}"
    assert expected(full=True)[0] is CUDAGraphMode.FULL
