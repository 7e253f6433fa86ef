"""Phase 07, lab 02 (agreement): the lab's steps, and the mistakes its tests must catch.

Steps 1 to 3 are the engine's own checks (phase07_lab02_reference.py hands the lab's group
to them), so most mistakes are planted in the engine's modules; step 4's function lives in
the reference module itself.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

REF = "tests.course.lab_checks.phase07_lab02_reference"
GROUP = "mini_vllm.distributed.parallel_state"
LAUNCHER = "mini_vllm.executor.external_launcher"

DIFFER = "differ = [rank for rank, v in enumerate(values) if v != values[0]]"
MIN_REDUCE = "dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)"
FINGERPRINT_ROW = "(s.seq_id, s.num_new_tokens, s.num_computed_tokens, s.new_token_ids)"
CRC = "return zlib.crc32(repr(rows).encode())"
AGREE = """        bounds = torch.tensor([value, -value], dtype=torch.long)
        dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
        return int(bounds[0]) == -int(bounds[1])"""
EVERYONE_OK = "everyone_ok = agreed_min(group, int(full_ok)) == 1"

STEPS = {
    1: [f"{REF}:check_same"],
    2: [f"{REF}:agreed_min"],
    3: [f"{REF}:schedule_fingerprint", f"{REF}:agree"],
    4: [f"{REF}:dispatch_together"],
}

MUTANTS = [
    # -- step 1: check_same --
    Mutant(
        name="only the rank that differs raises",
        mistake="Only a rank whose own value differs from rank 0's raises; rank 0 (and every "
        "rank that agrees with it) goes on into the capture and waits in its first warm-up "
        "for a partner that has stopped.",
        module=GROUP,
        old=f"{DIFFER}\n        if differ:",
        new=f"{DIFFER}\n        if value != values[0]:",
    ),
    Mutant(
        name="each rank compares with its own value",
        mistake="Each rank compares the gathered values with its own: every rank raises, but "
        "each blames another rank, so the ranks' logs disagree about who is off.",
        module=GROUP,
        old=DIFFER,
        new="differ = [rank for rank, v in enumerate(values) if v != value]",
    ),
    Mutant(
        name="values compared by repr",
        mistake="The values are compared as text: two equal dicts filled in another order "
        "are taken for different ones, and an engine that could run refuses to start.",
        module=GROUP,
        old=DIFFER,
        new="differ = [rank for rank, v in enumerate(values) if repr(v) != repr(values[0])]",
    ),
    Mutant(
        name="values compared by their pickles",
        mistake="The values are compared as pickled bytes (cheap to send, wrong to compare): "
        "equal values built in another order differ byte for byte.",
        module=GROUP,
        old=DIFFER,
        new="pickled = __import__('pickle').dumps\n        "
        "differ = [rank for rank, v in enumerate(values) if pickled(v) != pickled(values[0])]",
    ),
    Mutant(
        name="check_same gathers in a group of one",
        mistake="The check gathers even in a group of one, where no process group exists: "
        "the single-process engine fails at start-up.",
        module=GROUP,
        old="        if self.world_size == 1:\n            return\n        values: list[object]",
        new="        values: list[object]",
    ),
    Mutant(
        name="whole values in the message",
        mistake="The message prints each value whole: a ladder of 51 graphs, or a list of "
        "thousands of entries, drowns the one line a person must read.",
        module=GROUP,
        old="rank 0 has {_short(values[0])}, rank ",
        new="rank 0 has {values[0]!r}, rank ",
    ),
    # -- step 2: agreed_min --
    Mutant(
        name="the largest over ranks",
        mistake="The ranks take the largest count: a rank with less memory plans more blocks "
        "than it holds and writes past its cache the day the block manager hands out the "
        "last ones.",
        module=GROUP,
        old=MIN_REDUCE,
        new="dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cpu_group)",
    ),
    Mutant(
        name="rank 0's count for everyone",
        mistake="Rank 0's count is broadcast to every rank instead of the smallest: right "
        "only while rank 0 happens to be the poorest.",
        module=GROUP,
        old=MIN_REDUCE,
        new="dist.broadcast(t, src=0, group=self.cpu_group)",
    ),
    Mutant(
        name="the count in an int32",
        mistake="The count travels in an int32: a byte count of a machine's memory (past "
        "2**31) overflows.",
        module=GROUP,
        old="t = torch.tensor([value], dtype=torch.long)",
        new="t = torch.tensor([value], dtype=torch.int32)",
    ),
    Mutant(
        name="the count in a float64",
        mistake="The count travels in a float64 (a tensor's default for a float): past "
        "2**53 it comes back rounded.",
        module=GROUP,
        old="t = torch.tensor([value], dtype=torch.long)",
        new="t = torch.tensor([value], dtype=torch.float64)",
    ),
    Mutant(
        name="a tensor returned",
        mistake="The reduced tensor is returned as it is, not as a Python int: code that "
        "sizes a cache or compares counts with it gets a tensor.",
        module=GROUP,
        old="return int(t.item())",
        new="return t",
    ),
    Mutant(
        name="agreed_min reduces in a group of one",
        mistake="The minimum runs a collective even in a group of one, where no process "
        "group exists.",
        module=GROUP,
        old="        if self.world_size == 1:\n            return value\n        t = ",
        new="        t = ",
    ),
    # -- step 3: schedule_fingerprint and agree --
    Mutant(
        name="fingerprint ignores the row order",
        mistake="The fingerprint sorts the rows (or sums per-row numbers): two ranks with "
        "the same rows in another order lay the batch out differently and pass the check.",
        module=LAUNCHER,
        old=CRC,
        new="return zlib.crc32(repr(sorted(rows, key=repr)).encode())",
    ),
    Mutant(
        name="fingerprint ignores the token ids",
        mistake="The fingerprint covers the rows' shapes, not the tokens they feed: a rank "
        "whose prompt differs in its tokens alone passes, and the forwards mix the prompts.",
        module=LAUNCHER,
        old=FINGERPRINT_ROW,
        new="(s.seq_id, s.num_new_tokens, s.num_computed_tokens)",
    ),
    Mutant(
        name="fingerprint ignores the cached tokens",
        mistake="The fingerprint leaves out how many tokens each row has cached, so a rank "
        "whose row starts at another position passes.",
        module=LAUNCHER,
        old=FINGERPRINT_ROW,
        new="(s.seq_id, s.num_new_tokens, s.new_token_ids)",
    ),
    Mutant(
        name="fingerprint ignores the request ids",
        mistake="The fingerprint leaves out the request ids: two ranks that scheduled "
        "different requests with the same lengths and tokens pass.",
        module=LAUNCHER,
        old=FINGERPRINT_ROW,
        new="(s.num_new_tokens, s.num_computed_tokens, s.new_token_ids)",
    ),
    Mutant(
        name="fingerprint with Python's hash",
        mistake="The fingerprint is Python's hash(): a str's hash is salted per process, so "
        "two ranks under torchrun disagree on every step, the first included.",
        module=LAUNCHER,
        old=CRC,
        new="return hash(repr(rows)) % 2**63",
    ),
    Mutant(
        name="fingerprint too wide for an int64",
        mistake="The fingerprint is a whole SHA-256 as an int: 256 bits do not travel in "
        "the int64 the check all-reduces.",
        module=LAUNCHER,
        old=CRC,
        new="return int(__import__('hashlib').sha256(repr(rows).encode()).hexdigest(), 16)",
    ),
    Mutant(
        name="agree on the largest value alone",
        mistake="The ranks all-reduce the largest value and each compares it with its own: "
        "the rank holding the largest concludes they agree and runs the forward alone.",
        module=LAUNCHER,
        old="return int(bounds[0]) == -int(bounds[1])",
        new="return int(bounds[0]) == value",
    ),
    Mutant(
        name="agree on a sum",
        mistake="The ranks all-reduce the sum and compare it with N times their own value: "
        "right on two ranks, but with 1, 2 and 3 the middle rank concludes they agree.",
        module=LAUNCHER,
        old=AGREE,
        new="""        total = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=get_tp_group().cpu_group)
        return int(total) == value * get_tp_group().world_size""",
    ),
    Mutant(
        name="agree in an int32",
        mistake="The fingerprint travels in an int32: a crc32 above 2**31 overflows.",
        module=LAUNCHER,
        old="bounds = torch.tensor([value, -value], dtype=torch.long)",
        new="bounds = torch.tensor([value, -value], dtype=torch.int32)",
    ),
    Mutant(
        name="agree in two collectives",
        mistake="The largest and the smallest travel in two all-reduces: right, at twice "
        "the cost of a check that runs before every forward.",
        module=LAUNCHER,
        old=AGREE,
        new="""        top = torch.tensor([value], dtype=torch.long)
        low = top.clone()
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=get_tp_group().cpu_group)
        return int(top) == int(low)""",
    ),
    # -- step 4: dispatch_together --
    Mutant(
        name="each rank dispatches on its own flag",
        mistake="Each rank dispatches on its own flag: one replays a FULL graph while the "
        "other runs PIECEWISE graphs, two captures whose collectives were never recorded "
        "together.",
        module=REF,
        old=EVERYONE_OK,
        new="everyone_ok = full_ok",
    ),
    Mutant(
        name="any rank's yes wins",
        mistake="The flags are combined with the largest: the ranks agree, on a FULL graph "
        "that one of them cannot run.",
        module=REF,
        old=EVERYONE_OK,
        new="everyone_ok = -agreed_min(group, -int(full_ok)) == 1",
    ),
    Mutant(
        name="rank 0's flag for everyone",
        mistake="Rank 0's flag decides for every rank: the ranks agree, and a rank that "
        "cannot run a FULL graph is sent to one whenever rank 0 can.",
        module=REF,
        old=EVERYONE_OK,
        new="first = int(full_ok) if group.rank_in_group == 0 else 1\n    "
        "everyone_ok = agreed_min(group, first) == 1",
    ),
    Mutant(
        name="the collective skipped by a rank that cannot",
        mistake="A rank whose own flag is False skips the collective ('it cannot change my "
        "answer'): its next collective, the forward's all-reduce, meets the other ranks' "
        "flag exchange.",
        module=REF,
        old=EVERYONE_OK,
        new="everyone_ok = full_ok and agreed_min(group, 1) == 1",
    ),
]
