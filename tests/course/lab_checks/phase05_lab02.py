"""Phase 05, lab 02 (launch overhead): its steps and the mistakes its tests must catch."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

M = "mini_vllm.teaching.launch_overhead"

STEPS = {
    1: [f"{M}:kernel_gpu_us"],
    2: [f"{M}:eager_timeline"],
    3: [f"{M}:graph_timeline"],
    4: [f"{M}:crossover_batch"],
    5: [f"{M}:get_preset"],
}

MUTANTS = [
    Mutant(
        name="roofline adds instead of max",
        mistake="The kernel time adds the memory time and the compute time instead of "
        "taking the slower of the two (a roofline overlaps them).",
        module=M,
        old="return max(moved / hw.bandwidth, flops / hw.peak_flops) * 1e6",
        new="return (moved / hw.bandwidth + flops / hw.peak_flops) * 1e6",
    ),
    Mutant(
        name="weights read once per token",
        mistake="The weight bytes are multiplied by the batch size, as if each sequence "
        "read the weights again; batching would then save nothing.",
        module=M,
        old="moved = kernel.weight_bytes + batch * (kernel.bytes_per_token + "
        "kernel.kv_bytes_per_seq)",
        new="moved = batch * (kernel.weight_bytes + kernel.bytes_per_token + "
        "kernel.kv_bytes_per_seq)",
    ),
    Mutant(
        name="KV cache read once per step",
        mistake="The KV cache bytes are counted once per step instead of once per "
        "sequence, though every sequence reads its own cache.",
        module=M,
        old="moved = kernel.weight_bytes + batch * (kernel.bytes_per_token + "
        "kernel.kv_bytes_per_seq)",
        new="moved = kernel.weight_bytes + batch * kernel.bytes_per_token + "
        "kernel.kv_bytes_per_seq",
    ),
    Mutant(
        name="seconds to milliseconds",
        mistake="The roofline time in seconds is converted with 1e3 (milliseconds) "
        "instead of 1e6 (microseconds).",
        module=M,
        old="return max(moved / hw.bandwidth, flops / hw.peak_flops) * 1e6",
        new="return max(moved / hw.bandwidth, flops / hw.peak_flops) * 1e3",
    ),
    Mutant(
        name="eager kernel ignores its launch",
        mistake="In the eager timeline a kernel starts as soon as the GPU is free, even "
        "before the CPU has issued its launch: launch overhead disappears.",
        module=M,
        old="start = max(gpu_free, issued)",
        new="start = gpu_free",
    ),
    Mutant(
        name="eager kernel ignores the busy GPU",
        mistake="In the eager timeline a kernel starts as soon as its launch is issued, "
        "overlapping the kernel still running on the GPU.",
        module=M,
        old="start = max(gpu_free, issued)",
        new="start = issued",
    ),
    Mutant(
        name="eager gap forgotten",
        mistake="The eager timeline charges each kernel only its roofline time, without "
        "the per-launch GPU gap an eagerly launched kernel costs.",
        module=M,
        old="gpu_free = start + kernel_gpu_us(k, batch, hw) + hw.eager_gap_us",
        new="gpu_free = start + kernel_gpu_us(k, batch, hw)",
    ),
    Mutant(
        name="graph nodes start before the launch",
        mistake="In the graph timeline the nodes start at time 0, before the one graph "
        "launch has been issued.",
        module=M,
        old="    gpu_free = hw.graph_launch_us\n",
        new="    gpu_free = 0.0\n",
    ),
    Mutant(
        name="graph node cost forgotten",
        mistake="The graph timeline charges each node only its kernel's time, forgetting "
        "that a node still costs the GPU about a microsecond.",
        module=M,
        old="end = gpu_free + kernel_gpu_us(k, batch, hw) + hw.node_us",
        new="end = gpu_free + kernel_gpu_us(k, batch, hw)",
    ),
    Mutant(
        name="crossover returns the last batch that pays",
        mistake="The bisection returns its lower end, the last batch size where graphs "
        "still pay, instead of the first where they stop.",
        module=M,
        old="""        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return hi""",
        new="""        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo""",
    ),
    Mutant(
        name="crossover never says None",
        mistake="The crossover search does not check whether graphs still pay at "
        "max_batch, so it reports max_batch as a crossover that never happened.",
        module=M,
        old="""    if pays(max_batch):
        return None
""",
        new="",
    ),
    Mutant(
        name="crossover misses batch 1",
        mistake="The crossover search assumes graphs pay at batch 1, so a GPU-bound model "
        "whose graphs never pay gets 2 instead of 1.",
        module=M,
        old="""    if not pays(1):
        return 1
""",
        new="",
    ),
    Mutant(
        name="crossover scans every batch size",
        mistake="The crossover is found by trying batch sizes one by one, which "
        "simulates thousands of steps where a bisection needs a dozen.",
        module=M,
        old="""    lo, hi = 1, max_batch  # invariant: pays(lo) and not pays(hi)""",
        new="""    return next(b for b in range(2, max_batch + 1) if not pays(b))
    lo, hi = 1, max_batch  # invariant: pays(lo) and not pays(hi)""",
    ),
    Mutant(
        name="threshold not checked",
        mistake="A threshold of 1.0 or below is accepted, though a speedup below 1 means "
        "graphs are slower and the question makes no sense.",
        module=M,
        old="""    if threshold <= 1.0:
        raise ValueError""",
        new="""    if threshold < 0.0:
        raise ValueError""",
    ),
    Mutant(
        name="unknown preset is a KeyError",
        mistake="An unknown preset name raises the dictionary's bare KeyError instead of "
        "a ValueError that lists the presets there are.",
        module=M,
        old="""    try:
        return PRESETS[name]
    except KeyError:""",
        new="""    try:
        return PRESETS[name]
    except ZeroDivisionError:""",
    ),
    Mutant(
        name="a speedup equal to the threshold stops paying",
        mistake="Graphs are taken to pay only while the speedup is strictly above the "
        "threshold, so a batch that meets it exactly is reported as the crossover.",
        module=M,
        old="return simulate_step(preset, batch).speedup >= threshold",
        new="return simulate_step(preset, batch).speedup > threshold",
    ),
    Mutant(
        name="crossover search stops one short of max_batch",
        mistake="The search covers 1..max_batch - 1 (a range() off by one), so a crossover "
        "exactly at max_batch is reported as None.",
        module=M,
        old="""    if pays(max_batch):
        return None
""",
        new="""    if pays(max_batch - 1):
        return None
""",
    ),
    Mutant(
        name="bisection drops the midpoint",
        mistake="When the midpoint does not pay, the bisection moves its upper end below "
        "it, so the first batch that stops paying can fall out of the interval.",
        module=M,
        old="lo, hi = (mid, hi) if pays(mid) else (lo, mid)",
        new="lo, hi = (mid, hi) if pays(mid) else (lo, max(lo + 1, mid - 1))",
    ),
    Mutant(
        name="eager gap charged to the CPU",
        mistake="The per-kernel gap of eager execution is added to the CPU's launch instead "
        "of to the kernel's GPU time, so launches stop being back to back.",
        module=M,
        old="""        issued = cpu_free + hw.launch_us
""",
        new="""        issued = cpu_free + hw.launch_us + hw.eager_gap_us
""",
    ),
    Mutant(
        name="FLOPs counted once a step",
        mistake="The FLOPs are those of one token whatever the batch, as if the weights' "
        "reuse made the arithmetic free too: no kernel ever turns compute-bound.",
        module=M,
        old="flops = batch * kernel.flops_per_token",
        new="flops = kernel.flops_per_token",
    ),
]
