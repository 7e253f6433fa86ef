"""Run the README's prediction scenarios on your scheduler, beside your predictions.

Run it from this folder: `python explore.py`. It plays the scenarios of steps 2, 3 and 5
through your `Scheduler` (with mini_vllm's block manager, every sampled token a 7),
prints each step's rows as (id, tokens computed before, new tokens), and then what your
code gives next to what you predicted in predictions.py. Where they differ, one of the
two is wrong: the step's tests say whether it is your code.
"""

from __future__ import annotations

import predictions
import scheduler as mine

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.sequence import Sequence
from mini_vllm.sampling_params import SamplingParams


def request(seq_id, prompt_len, max_tokens=8):
    return Sequence(
        seq_id, range(1, prompt_len + 1), SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError as exc:
        print(f"  {what}: not written yet ({exc})")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def show(step, out):
    rows = [(r.seq_id, r.num_computed_tokens, r.num_new_tokens) for r in out.scheduled]
    preempted = f"  preempted {list(out.preempted_ids)}" if out.preempted_ids else ""
    print(f"  step {step}: {rows}{preempted}")


def run(sched, requests):
    """Every request to its end; returns the outputs, printing each step."""
    for seq in requests:
        sched.add_request(seq)
    outputs = []
    while sched.has_unfinished_requests() and len(outputs) < 200:
        out = sched.schedule()
        show(len(outputs), out)
        sched.update_from_output(out, [7] * out.num_reqs)
        outputs.append(out)
    return outputs


def step2() -> dict[str, object]:
    """a, b, c, d (4, 7, 2, 3 tokens); max_num_seqs=3; the first step, budget 10 then 32."""
    found: dict[str, object] = {}
    for budget in (10, 32):
        config = mine.SchedulerConfig(
            max_num_seqs=3, max_num_batched_tokens=budget, max_model_len=64
        )
        sched = mine.Scheduler(config, BlockManager(64, 4))
        for name, prompt_len in (("a", 4), ("b", 7), ("c", 2), ("d", 3)):
            sched.add_request(request(name, prompt_len))
        out = sched.schedule()
        print(f"  budget {budget}:")
        show(0, out)
        counts = sched.get_request_counts()
        print(f"  (running, waiting) = {counts}")
        if budget == 10:
            b = next((row for row in out.scheduled if row.seq_id == "b"), None)
            found["S2_B_FIRST_CHUNK"] = b.num_new_tokens if b else 0
            found["S2_B_SAMPLES"] = b.samples_token if b else False
            found["S2_REQUEST_COUNTS"] = list(counts)
        else:
            found["S2_RUNNING_WITH_BUDGET_32"] = counts[0]
    return found


def step3() -> dict[str, object]:
    """max_model_len=16: w (16 tokens), x (15), z (12), max_tokens=8; one step."""
    config = mine.SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=16)
    sched = mine.Scheduler(config, BlockManager(64, 4))
    x = request("x", 15)
    for seq in (request("w", 16), x, request("z", 12)):
        sched.add_request(seq)
    out = sched.schedule()
    show(0, out)
    done = sched.update_from_output(out, [7] * out.num_reqs)
    for seq in done:
        print(f"  finished: {seq.seq_id} ({seq.finish_reason}) {seq.error or ''}")
    return {
        "S3_FINISHED": [seq.seq_id for seq in done],
        "S3_X_FINISH_REASON": None if x.finish_reason is None else str(x.finish_reason),
        "S3_REQUEST_COUNTS": list(sched.get_request_counts()),
    }


def step5() -> dict[str, object]:
    """Question 1's run (4 blocks of 4, max_num_seqs=2), then the decision's (2 blocks)."""
    print("  4 blocks of 4, max_num_seqs=2, budget 32: a, b, c (6, 5, 3 tokens)")
    config = mine.SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64)
    sched = mine.Scheduler(config, BlockManager(4, 4))
    outputs = run(sched, [request("a", 6, 6), request("b", 5, 6), request("c", 3, 6)])
    first = next((i for i, out in enumerate(outputs) if out.preempted_ids), None)
    victim = outputs[first].preempted_ids[0] if first is not None else None
    back = [
        row.num_new_tokens
        for out in outputs[(first or 0) + 1 :]
        for row in out.scheduled
        if row.seq_id == victim and row.num_computed_tokens == 0
    ]
    print("  2 blocks of 4, budget 5: a (3 tokens, max_tokens 5), b (6 tokens, max_tokens 2)")
    config = mine.SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64)
    two_blocks = run(
        mine.Scheduler(config, BlockManager(2, 4)), [request("a", 3, 5), request("b", 6, 2)]
    )
    return {
        "S5_FIRST_PREEMPTION_STEP": first,
        "S5_FIRST_VICTIM": victim,
        "S5_RECOMPUTED_TOKENS": back[0] if back else None,
        "S5_PREEMPTIONS": sched.num_preemptions,
        "S5_TWO_BLOCKS_TOKENS_COMPUTED": sum(out.total_num_tokens for out in two_blocks),
    }


def main() -> None:
    found: dict[str, object] = {}
    for name, scenario in (("step 2", step2), ("step 3", step3), ("step 5", step5)):
        print(f"\n{name}:")
        found.update(attempt(name, scenario) or {})
    print("\nyour predictions beside your code:")
    for answer in (
        "S2_B_FIRST_CHUNK",
        "S2_B_SAMPLES",
        "S2_REQUEST_COUNTS",
        "S2_RUNNING_WITH_BUDGET_32",
        "S3_FINISHED",
        "S3_X_FINISH_REASON",
        "S3_REQUEST_COUNTS",
        "S5_FIRST_PREEMPTION_STEP",
        "S5_FIRST_VICTIM",
        "S5_RECOMPUTED_TOKENS",
        "S5_PREEMPTIONS",
        "S5_TWO_BLOCKS_TOKENS_COMPUTED",
    ):
        yours = repr(found[answer]) if answer in found else "(not run)"
        print(
            f"  {answer:30} your code: {yours:12} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
