"""Run the README's scenario on your code, beside your predictions: `python explore.py`.

Run it from this folder. It drives mini_vllm's scheduler and block manager through the
README's steps S1 to S4, builds each step's inputs with your `prepare_inputs`, pads S3
and S4 to 4 tokens with your `pad_inputs`, and prints what your code gives next to what
you predicted in predictions.py. Where they differ, one of the two is wrong: the step's
tests say whether it is your code.
"""

from __future__ import annotations

import model_inputs as mine
import predictions

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
from mini_vllm.engine.sequence import Sequence
from mini_vllm.sampling_params import SamplingParams

FIELDS = ("input_ids", "positions", "slot_mapping", "query_lens", "seq_lens")
SAMPLED = {"S1": (90, None), "S2": (91, None), "S3": (92, 50), "S4": (93, 51)}


def request(seq_id, prompt):
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=8, ignore_eos=True))


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError:
        print(f"  {what}: not written yet")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def show(inputs) -> None:
    for name in FIELDS:
        print(f"  {name:15} {getattr(inputs, name)}")
    start = attempt("query_start_loc", lambda: inputs.query_start_loc)
    if start is not None:
        print(f"  {'query_start_loc':15} {start}")
    print(f"  {'logits_indices':15} {inputs.logits_indices}   sampling_rows {inputs.sampling_rows}")
    print(f"  {'uniform_decode':15} {inputs.uniform_decode}")


def main() -> None:
    # Block size 4, two sequences, a budget of 6 tokens, blocks handed out 0, 1, 2, ...
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=6, max_model_len=64),
        BlockManager(32, 4),
    )
    sched.add_request(request("a", [1, 2, 3, 4, 5]))
    out = sched.schedule()
    sched.update_from_output(out, [99])  # a's prefill samples 99
    sched.add_request(request("b", list(range(10, 21))))
    mine_of = {}
    for name, (a_token, b_token) in SAMPLED.items():
        out = sched.schedule()
        print(f"\n{name}: rows {[row.seq_id for row in out.scheduled]}")
        inputs = attempt("prepare_inputs", lambda out=out: mine.prepare_inputs(out))
        if inputs is not None:
            show(inputs)
            mine_of[name] = inputs
            if name in ("S3", "S4"):
                padded = attempt("pad_inputs", lambda inputs=inputs: mine.pad_inputs(inputs, 4))
                if padded is not None:
                    print(f"  padded to 4: {padded.num_reqs} rows, seq_lens {padded.seq_lens}")
                    mine_of[name + " padded"] = padded
        tokens = {"a": a_token, "b": b_token}
        sched.update_from_output(
            out, [tokens[row.seq_id] if row.samples_token else None for row in out.scheduled]
        )

    print("\nyour predictions beside your code:")
    checks = {
        "S2_POSITIONS": ("S2", "positions"),
        "S2_SLOT_MAPPING": ("S2", "slot_mapping"),
        "S3_LOGITS_INDICES": ("S3", "logits_indices"),
        "S3_UNIFORM_DECODE": ("S3", "uniform_decode"),
        "S4_SLOT_MAPPING": ("S4", "slot_mapping"),
        "S3_PADDED_NUM_REQS": ("S3 padded", "num_reqs"),
        "S4_PADDED_NUM_REQS": ("S4 padded", "num_reqs"),
        "S4_PADDED_SEQ_LENS": ("S4 padded", "seq_lens"),
    }
    for answer, (step, field) in checks.items():
        inputs = mine_of.get(step)
        yours = "(not run)" if inputs is None else repr(getattr(inputs, field))
        print(
            f"  {answer:20} your code: {yours:24} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
