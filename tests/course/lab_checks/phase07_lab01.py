"""Phase 07, lab 01 (sharded layers): the mistakes students make, and the lab's steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.layers.linear"
COLUMN_FORWARD = """        if self.gather_output and self.tp_size > 1:
            return tensor_model_parallel_all_gather(output_parallel, dim=-1)
        return output_parallel"""
ROW_REDUCE = "if self.reduce_results and self.tp_size > 1:"
KV_RANK = 'rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.num_kv_head_replicas'

MUTANTS = [
    # -- step 1: a rank's shard --
    Mutant(
        name="uneven split rounds down",
        mistake="a size that does not divide by the ranks is split with //, so the ranks "
        "silently drop the last rows instead of the user hearing which size to change",
        module=MODULE,
        old="    if numerator % denominator:",
        new="    if False:",
    ),
    Mutant(
        name="column split by input columns",
        mistake="the column-parallel weight is split along its input dimension, as if "
        "'column-parallel' named the weight's columns rather than the output's",
        module=MODULE,
        old="self._load_shard(param, loaded, dim=0, size=self.output_size_per_partition)",
        new="self._load_shard(param, loaded, dim=1, size=self.output_size_per_partition)",
    ),
    Mutant(
        name="row split by output rows",
        mistake="the row-parallel weight is split along its output dimension, so a rank's "
        "block does not meet the input slice it receives",
        module=MODULE,
        old="self._load_shard(param, loaded, dim=1, size=self.input_size_per_partition)",
        new="self._load_shard(param, loaded, dim=0, size=self.input_size_per_partition)",
    ),
    Mutant(
        name="every rank loads the first shard",
        mistake="the shard's offset forgets the rank: every rank keeps the first slice, "
        "which has the right shape on every rank",
        module=MODULE,
        old="shard = loaded.narrow(dim, self.tp_rank * size, size) if self.tp_size > 1 else loaded",
        new="shard = loaded.narrow(dim, 0, size) if self.tp_size > 1 else loaded",
    ),
    Mutant(
        name="weight aliases the checkpoint",
        mistake="the parameter is pointed at the checkpoint's slice instead of copied into, "
        "so it takes the checkpoint's dtype and changes when the caller's tensor does",
        module=MODULE,
        old="        param.data.copy_(shard)",
        new="        param.data = shard",
    ),
    # -- step 2: the forwards --
    Mutant(
        name="row-parallel forgets the all-reduce",
        mistake="the row-parallel layer returns its partial product: each rank holds only "
        "its share of every output's sum",
        module=MODULE,
        old=ROW_REDUCE,
        new="if False:",
    ),
    Mutant(
        name="row-parallel ignores reduce_results",
        mistake="the row-parallel layer sums over the ranks even when the caller asked for "
        "its own contribution (reduce_results=False)",
        module=MODULE,
        old=ROW_REDUCE,
        new="if self.tp_size > 1:",
    ),
    Mutant(
        name="column-parallel all-reduces its slices",
        mistake="the column-parallel layer sums its output over the ranks, adding slices "
        "of different outputs together, and spends a collective it does not need",
        module=MODULE,
        old=COLUMN_FORWARD,
        new=COLUMN_FORWARD.replace(
            "return output_parallel", "return tensor_model_parallel_all_reduce(output_parallel)"
        ),
    ),
    Mutant(
        name="gather_output ignored",
        mistake="gather_output is ignored: a caller that asked for the whole output gets "
        "this rank's slice",
        module=MODULE,
        old="if self.gather_output and self.tp_size > 1:",
        new="if False:",
    ),
    Mutant(
        name="all-reduce in float32",
        mistake="the partial sums are cast to float32 before the all-reduce, so the output "
        "no longer has the input's dtype",
        module=MODULE,
        old="return tensor_model_parallel_all_reduce(output_parallel)",
        new="return tensor_model_parallel_all_reduce(output_parallel.float())",
    ),
    # -- step 3: gate and up --
    Mutant(
        name="merged shards ignore the rank",
        mistake="each rank loads the first rows of gate and of up, whatever its rank",
        module=MODULE,
        old="shard = loaded.narrow(0, self.tp_rank * size, size) if tp > 1 else loaded",
        new="shard = loaded.narrow(0, 0, size) if tp > 1 else loaded",
    ),
    Mutant(
        name="merged offset as index times size",
        mistake="up's rows start at shard_id times up's own share, which is gate's share "
        "only when the projections have the same size",
        module=MODULE,
        old="start = sum(self.output_sizes[:shard_id]) // tp",
        new="start = shard_id * (self.output_sizes[shard_id] // tp)",
    ),
    Mutant(
        name="merged copies into the checkpoint",
        mistake="the copy goes the wrong way: the checkpoint tensor is overwritten with the "
        "layer's uninitialised rows",
        module=MODULE,
        old="        rows.copy_(shard)",
        new="        shard.copy_(rows)",
    ),
    # -- step 4: q, k and v --
    Mutant(
        name="kv head by rank modulo heads",
        mistake="a replicated KV head is picked as rank % kv_heads, so ranks 0 and 1 hold "
        "different KV heads though their query heads read the same one",
        module=MODULE,
        old=KV_RANK,
        new='rank = self.tp_rank if shard_id == "q" else self.tp_rank % self.total_num_kv_heads',
    ),
    Mutant(
        name="kv heads split like q even when too few",
        mistake="k and v take the rank's slice like q even when there are fewer KV heads "
        "than ranks",
        module=MODULE,
        old=KV_RANK,
        new="rank = self.tp_rank",
    ),
    Mutant(
        name="k and v offsets swapped",
        mistake="k is written where v belongs and v where k belongs in the rank's [q | k | v]",
        module=MODULE,
        old='"k": (self.q_size, self.kv_size),\n            "v": (self.q_size + self.kv_size,',
        new='"v": (self.q_size, self.kv_size),\n            "k": (self.q_size + self.kv_size,',
    ),
]

STEPS = {
    1: [
        f"{MODULE}:_divide",
        f"{MODULE}:LinearBase._load_shard",
        f"{MODULE}:ColumnParallelLinear.weight_loader",
        f"{MODULE}:RowParallelLinear.weight_loader",
    ],
    2: [f"{MODULE}:ColumnParallelLinear.forward", f"{MODULE}:RowParallelLinear.forward"],
    3: [f"{MODULE}:MergedColumnParallelLinear.weight_loader"],
    4: [f"{MODULE}:QKVParallelLinear.weight_loader"],
}

STARTER_DIFFERS = {
    "LinearBase (fields)": "the starter's LinearBase is mini_vllm's, inherited whole, with "
    "only the shard helper left to write",
}
