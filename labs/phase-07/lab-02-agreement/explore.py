"""Run the README's scenarios beside your predictions: `python explore.py`.

Run it from this folder. For every question of predictions.py it prints what the code
gives and what you predicted: the engine's dispatcher for the questions about it (steps
1 and 4 ask what the ranks would do without your functions), your own code for the rest.
Where the two differ, one of them is wrong, and the step's tests say whether it is your
code. It also runs your functions on two gloo ranks, as the tests do, and counts the
collectives each makes (a question of the README).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time

import agreement as mine
import predictions
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from mini_vllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
)
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import Sequence

LADDERS = ([1, 2, 4, 8], [1, 2, 8])
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier")


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"  {name:38} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"  {name:38} your code raised {type(exc).__name__}: {str(exc)[:200]}")
        return
    print(f"  {name:38} gives: {value!r:<24} you predicted: {predicted!r}")


# --- two ranks, as in the tests ------------------------------------------------------------


def rank_main(rank: int, init_file: str, out_dir: str, job: str) -> None:
    torch.set_num_threads(1)
    init_distributed_environment(2, rank, f"file://{init_file}", "gloo", 10)
    initialize_model_parallel(2)
    group = mine.TPGroup(2, rank, get_tp_group().cpu_group)
    calls: list[tuple[str, int]] = []
    depth = [0]
    saved = []

    def counted(name, original):
        def call(*args, **kwargs):
            calls.append((name, depth[0]))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for module in (dist, dist.distributed_c10d):
        for name in COLLECTIVES:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, counted(name, getattr(module, name)))
    try:
        if job == "check":
            mine.check_same(group, "the capture ladder", LADDERS[rank])
            result = "returned"
        elif job == "agree":
            result = mine.agree(group, [7, 8][rank])
        else:  # "dispatch": rank 0 may run FULL graphs, rank 1 may not
            mode, key = mine.dispatch_together(group, dispatcher(), 3, True, rank == 0)
            result = (mode.name, key.num_tokens)
    except NotImplementedError:
        result = "(not written yet)"
    except Exception as exc:
        result = f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump((result, calls), f)
    destroy_distributed_environment()


def on_two_ranks(job: str):
    with tempfile.TemporaryDirectory() as tmp:
        start = "fork" if sys.platform == "linux" else "spawn"
        context = torch_mp.start_processes(
            rank_main,
            args=(os.path.join(tmp, "init"), tmp, job),
            nprocs=2,
            join=False,
            start_method=start,
        )
        deadline = time.monotonic() + 60
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for proc in context.processes:
                    proc.kill()
                break
        results = []
        for rank in range(2):
            path = os.path.join(tmp, f"rank{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results.append(pickle.load(f))
            else:
                results.append(("(the rank ended without a result)", []))
    return results


def print_ranks(job: str, what: str) -> None:
    try:
        results = on_two_ranks(job)
    except Exception as exc:  # a rank's error, shortened
        text = str(exc).strip().splitlines()
        print(f"  the ranks failed: {text[-1] if text else exc!r}")
        return
    print(f"  {what}:")
    for rank, (result, calls) in enumerate(results):
        made = [name for name, depth in calls if depth == 0]
        inside = [name for name, depth in calls if depth > 0]
        extra = f", and inside them {len(inside)} more: {inside}" if inside else ""
        print(f"    rank {rank}: {result}")
        print(f"            {len(made)} collective(s) made: {made}{extra}")


# --- the scenarios -------------------------------------------------------------------------


def dispatcher(sizes=(1, 2, 4, 8)) -> CudagraphDispatcher:
    return CudagraphDispatcher("full_and_piecewise", list(sizes), 8)


def first_capture_that_differs() -> int:
    keys = [[k.num_tokens for _, k in dispatcher(s).all_keys()] for s in LADDERS]
    return next(i for i, (a, b) in enumerate(zip(*keys)) if a != b) + 1


def row(seq_id, cached, new_ids, blocks) -> ScheduledSequence:
    seq = Sequence(seq_id, [5] * cached + list(new_ids))
    return ScheduledSequence(
        seq, len(new_ids), cached, tuple(new_ids), tuple(blocks), cached == 0, True
    )


def step(spec) -> SchedulerOutput:
    return SchedulerOutput(0, tuple(row(*r) for r in spec), 16)


BASE = [("req-a", 7, [42], [0, 1]), ("req-b", 3, [17], [2])]


def fresh_hash() -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    code = "print(hash(('req-7', 1, 12)))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return done.stdout.strip()


def main() -> None:
    print("Before step 1: the ladders 1, 2, 4, 8 (rank 0) and 1, 2, 8 (rank 1), no check")
    ranks = [dispatcher(s) for s in LADDERS]
    show("GRAPHS_EACH_RANK_CAPTURES", lambda: [len(d.all_keys()) for d in ranks])
    show("ROWS_OF_A_DECODE_OF_3", lambda: [d.dispatch(3, True)[1].num_tokens for d in ranks])
    show("ROWS_OF_A_DECODE_OF_5", lambda: [d.dispatch(5, True)[1].num_tokens for d in ranks])
    show("FIRST_CAPTURE_THAT_DIFFERS", first_capture_that_differs)
    print_ranks("check", "your check_same of the two ladders, on two ranks")

    print("\nBefore step 3: fingerprints (your schedule_fingerprint)")
    show("HASH_SAME_IN_TWO_PROCESSES", lambda: fresh_hash() == fresh_hash())
    swapped = [BASE[1], BASE[0]]
    moved = [(s, c, n, [b + 10 for b in blocks]) for s, c, n, blocks in BASE]
    show(
        "FINGERPRINT_CHANGES_WHEN_ROWS_SWAP",
        lambda: mine.schedule_fingerprint(step(BASE)) != mine.schedule_fingerprint(step(swapped)),
    )
    show(
        "FINGERPRINT_CHANGES_WITH_BLOCK_TABLES",
        lambda: mine.schedule_fingerprint(step(BASE)) != mine.schedule_fingerprint(step(moved)),
    )
    print_ranks("agree", "your agree, rank 0 passing 7 and rank 1 passing 8")

    print("\nBefore step 4: rank 0 may run FULL graphs, rank 1 may not, each dispatching alone")
    alone = [dispatcher().dispatch(3, True, disable_full=not ok) for ok in (True, False)]
    mixed = [dispatcher().dispatch(3, False, disable_full=not ok) for ok in (True, False)]
    show("MODES_OF_A_DECODE_OF_3", lambda: [m.name for m, _ in alone])
    show("ROWS_OF_THAT_DECODE", lambda: [k.num_tokens for _, k in alone])
    show("MODES_OF_A_MIXED_STEP_OF_3", lambda: [m.name for m, _ in mixed])
    print_ranks("dispatch", "your dispatch_together of that decode, on two ranks")


if __name__ == "__main__":
    main()
