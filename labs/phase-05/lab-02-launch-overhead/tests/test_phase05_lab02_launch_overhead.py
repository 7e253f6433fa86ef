"""Lab 02 — the two-lane launch timeline, the crossover batch size, and the presets.

Steps: 1 the roofline, 2 the eager timeline, 3 the graph timeline (and the presets'
numbers, which need both), 4 the crossover, 5 looking a preset up by name.
"""

import pytest

import mini_vllm.teaching.launch_overhead as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(
    __file__, starter="launch_overhead.py", reference="mini_vllm.teaching.launch_overhead"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab02_answers"
)

LLAMA_NAME = "h100-llama3.1-8b"
SMOLLM2_NAME = "h100-smollm2-135m"
# Preset objects, not names: looking a name up is step 5.
LLAMA = impl.PRESETS[LLAMA_NAME]
SMOLLM2 = impl.PRESETS[SMOLLM2_NAME]
# The course's Llama-3.1-8B table on an H100 SXM, decode ms/step, eager -> graph.
LLAMA_TABLE = {1: (8.4, 5.1), 4: (9.2, 6.0), 16: (12.1, 9.3), 32: (18.7, 16.1)}


def hardware(**overrides):
    values = dict(
        launch_us=10.0,
        graph_launch_us=12.0,
        eager_gap_us=0.0,
        node_us=1.0,
        bandwidth=1e12,
        peak_flops=1e15,
    )
    values.update(overrides)
    return impl.Hardware(**values)


def tiny(name, us, hw):
    """A memory-bound kernel that takes `us` µs at any batch size (weights only)."""
    return impl.Kernel(name, weight_bytes=us * 1e-6 * hw.bandwidth)


def lane(spans, name):
    return [s for s in spans if s.lane == name]


def toy_preset(hw, kernels, module=impl):
    return module.Preset("toy", "toy", hw, tuple(kernels), {})


# The README's scenarios, built on the reference for the prediction tests.
def readme_hardware(module):
    """Hardware H: 1 TB/s, 100 TFLOP/s; 10 µs a launch, 12 µs a graph launch, 1 µs a node."""
    return module.Hardware(
        launch_us=10.0,
        graph_launch_us=12.0,
        eager_gap_us=0.0,
        node_us=1.0,
        bandwidth=1e12,
        peak_flops=1e14,
    )


def kernel_k(module):
    """K: 4 MB of weights, 20 MFLOP a token."""
    return module.Kernel("K", weight_bytes=4e6, flops_per_token=2e7)


def toy_t(module):
    """T: 37 kernels of 1 µs each, whatever the batch, on hardware H."""
    hw = readme_hardware(module)
    return toy_preset(hw, [module.Kernel(f"t{i}", weight_bytes=1e6) for i in range(37)], module)


def toy_e(module):
    """E: one kernel of b µs at batch b; 10 µs to launch it, 2 µs to launch its graph."""
    hw = module.Hardware(
        launch_us=10.0,
        graph_launch_us=2.0,
        eager_gap_us=0.0,
        node_us=0.0,
        bandwidth=1e6,
        peak_flops=1e15,
    )
    return toy_preset(hw, [module.Kernel("e", bytes_per_token=1.0)], module)


# --- step 1: the roofline ------------------------------------------------------------------


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes():
    hw, k = readme_hardware(reference), kernel_k(reference)
    at_1 = reference.kernel_gpu_us(k, 1, hw)
    first_slower = next(b for b in range(1, 1000) if reference.kernel_gpu_us(k, b, hw) > at_1)
    check_predictions(
        answers,
        {
            "K_GPU_US_BATCH_1": at_1,
            "K_GPU_US_BATCH_64": reference.kernel_gpu_us(k, 64, hw),
            "K_FIRST_BATCH_SLOWER_THAN_BATCH_1": first_slower,
        },
    )


@pytest.mark.step1
def test_a_kernel_at_the_ridge_takes_its_memory_time_and_turns_compute_bound_after_it():
    # K at batch 20 needs 4 µs for its bytes and 4 µs for its FLOPs: still 4 µs, not 8.
    hw, k = readme_hardware(impl), kernel_k(impl)
    assert impl.kernel_gpu_us(k, 1, hw) == pytest.approx(4.0)
    assert impl.kernel_gpu_us(k, 20, hw) == pytest.approx(4.0)
    assert impl.kernel_gpu_us(k, 21, hw) == pytest.approx(4.2)
    assert impl.kernel_gpu_us(k, 64, hw) == pytest.approx(12.8)


@pytest.mark.step1
def test_kernel_time_is_the_roofline_of_bytes_and_flops():
    hw = hardware(bandwidth=1e12, peak_flops=1e14)
    memory_bound = impl.Kernel("gemv", weight_bytes=4e6, flops_per_token=1e6)
    compute_bound = impl.Kernel("gemm", weight_bytes=1e6, flops_per_token=1e9)
    assert impl.kernel_gpu_us(memory_bound, 1, hw) == pytest.approx(4.0)  # 4 MB at 1 TB/s
    assert impl.kernel_gpu_us(compute_bound, 1, hw) == pytest.approx(10.0)  # 1 GFLOP, 100 TFLOP/s
    assert impl.kernel_gpu_us(compute_bound, 4, hw) == pytest.approx(40.0)


@pytest.mark.step1
def test_kernel_weight_bytes_are_read_once_activation_and_kv_bytes_grow_with_batch():
    hw = hardware(bandwidth=1e12)
    k = impl.Kernel("attention", weight_bytes=2e6, bytes_per_token=1e5, kv_bytes_per_seq=4e5)
    assert impl.kernel_gpu_us(k, 1, hw) == pytest.approx(2.5)
    assert impl.kernel_gpu_us(k, 8, hw) == pytest.approx(2.0 + 8 * 0.5)


@pytest.mark.step1
@pytest.mark.parametrize("batch", [0, -3, 2.0, True])
def test_kernel_time_refuses_a_batch_that_is_not_a_positive_integer(batch):
    with pytest.raises(ValueError):
        impl.kernel_gpu_us(impl.Kernel("k", weight_bytes=1e6), batch, hardware())


# --- step 2: the eager timeline -------------------------------------------------------------


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    toy = toy_t(reference)
    eager = reference.eager_timeline(toy.kernels, 1, toy.hardware)
    check_predictions(answers, {"T_EAGER_US": reference.step_time_us(eager)})


@pytest.mark.step2
def test_the_eager_gap_is_gpu_time_the_launches_stay_back_to_back():
    hw = hardware(launch_us=4.0, eager_gap_us=3.0)
    spans = impl.eager_timeline([tiny("a", 1.0, hw), tiny("b", 1.0, hw)], 1, hw)
    assert [(s.start_us, s.end_us) for s in lane(spans, "cpu")] == [(0.0, 4.0), (4.0, 8.0)]
    gpu = [t for s in lane(spans, "gpu") for t in (s.start_us, s.end_us)]
    assert gpu == pytest.approx([4.0, 8.0, 8.0, 12.0]), "each kernel: 1 µs plus a 3 µs gap"


@pytest.mark.step2
def test_eager_step_is_launch_bound_when_launch_cost_exceeds_kernel_time():
    hw = hardware(launch_us=10.0, eager_gap_us=0.5)
    kernels = [tiny(f"k{i}", 2.0, hw) for i in range(20)]
    spans = impl.eager_timeline(kernels, 1, hw)
    # The GPU waits for every launch: the step is 20 launches plus the last kernel.
    assert impl.step_time_us(spans) == pytest.approx(20 * 10.0 + 2.0 + 0.5)
    assert [s.start_us for s in lane(spans, "gpu")] == pytest.approx(
        [10.0 * (i + 1) for i in range(20)]
    )


@pytest.mark.step2
def test_eager_step_is_gpu_bound_when_kernels_outlast_their_launches():
    hw = hardware(launch_us=5.0, eager_gap_us=1.0)
    kernels = [tiny(f"k{i}", 100.0, hw) for i in range(10)]
    spans = impl.eager_timeline(kernels, 1, hw)
    # Only the first launch shows; after it the CPU runs ahead and the GPU never idles.
    assert impl.step_time_us(spans) == pytest.approx(5.0 + 10 * (100.0 + 1.0))


@pytest.mark.step2
def test_eager_gpu_starts_a_kernel_only_after_its_launch_and_the_previous_kernel():
    hw = hardware(launch_us=4.0, eager_gap_us=1.0)
    kernels = [
        tiny(name, us, hw)
        for name, us in [("a", 1.0), ("b", 30.0), ("c", 1.0), ("d", 1.0), ("e", 20.0)]
    ]
    spans = impl.eager_timeline(kernels, 1, hw)
    cpu, gpu = lane(spans, "cpu"), lane(spans, "gpu")
    assert len(spans) == 10
    assert [s.name for s in cpu] == [s.name for s in gpu] == list("abcde")
    assert cpu[0].start_us == 0.0
    for i, (issued, ran) in enumerate(zip(cpu, gpu)):
        assert issued.end_us - issued.start_us == pytest.approx(4.0)
        assert ran.start_us >= issued.end_us - 1e-9, f"kernel {ran.name} started before its launch"
        if i:
            assert ran.start_us >= gpu[i - 1].end_us - 1e-9, (
                f"kernel {ran.name} overlaps the one before"
            )
            assert issued.start_us == pytest.approx(cpu[i - 1].end_us), (
                "the CPU issues launches back to back"
            )
    # ...and as soon as both hold: never later.
    for i, ran in enumerate(gpu):
        ready = max(cpu[i].end_us, gpu[i - 1].end_us if i else 0.0)
        assert ran.start_us == pytest.approx(ready)
        assert ran.end_us - ran.start_us == pytest.approx(
            impl.kernel_gpu_us(kernels[i], 1, hw) + 1.0
        )


@pytest.mark.step2
def test_eager_kernel_time_follows_the_batch():
    hw = hardware(launch_us=1.0, eager_gap_us=0.0, bandwidth=1e12)
    grows = impl.Kernel("grows", bytes_per_token=1e6)  # 1 µs a token
    spans = impl.eager_timeline([grows], 50, hw)
    assert impl.step_time_us(spans) == pytest.approx(1.0 + 50.0)


# --- step 3: the graph timeline, and the presets' numbers ------------------------------------


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    result = reference.simulate_step(toy_t(reference), 1)
    check_predictions(answers, {"T_GRAPH_US": result.graph_us, "T_SPEEDUP": result.speedup})


@pytest.mark.step3
def test_graph_step_is_one_launch_plus_gpu_time_of_every_node():
    hw = hardware(graph_launch_us=12.0, node_us=1.5)
    kernels = [tiny(f"k{i}", 3.0, hw) for i in range(50)]
    spans = impl.graph_timeline(kernels, 1, hw)
    (launch,) = lane(spans, "cpu")
    assert (launch.start_us, launch.end_us) == pytest.approx((0.0, 12.0))
    gpu = lane(spans, "gpu")
    assert [s.name for s in gpu] == [k.name for k in kernels]
    assert gpu[0].start_us == pytest.approx(12.0), "the first node starts when the launch ends"
    for before, node in zip(gpu, gpu[1:]):
        assert node.start_us == pytest.approx(before.end_us), "nodes run back to back"
    assert impl.step_time_us(spans) == pytest.approx(12.0 + 50 * (3.0 + 1.5))


@pytest.mark.step3
def test_graph_kernel_time_follows_the_batch():
    hw = hardware(graph_launch_us=2.0, node_us=0.0, bandwidth=1e12)
    grows = impl.Kernel("grows", bytes_per_token=1e6)  # 1 µs a token
    assert impl.step_time_us(impl.graph_timeline([grows], 30, hw)) == pytest.approx(2.0 + 30.0)


@pytest.mark.step3
def test_launches_per_step_eager_is_the_kernel_count_graph_is_one():
    hw = hardware()
    result = impl.simulate_step(toy_preset(hw, [tiny(f"k{i}", 1.0, hw) for i in range(37)]), 1)
    assert (result.eager_launches, result.graph_launches) == (37, 1)
    assert result.eager_us == pytest.approx(37 * 10.0 + 1.0)  # launch-bound, then the last kernel
    assert result.graph_us == pytest.approx(12.0 + 37 * (1.0 + 1.0))  # one launch, then the nodes
    assert result.speedup == pytest.approx(result.eager_us / result.graph_us)


@pytest.mark.step3
@pytest.mark.parametrize("preset", [LLAMA, SMOLLM2], ids=[LLAMA_NAME, SMOLLM2_NAME])
def test_speedup_falls_as_the_batch_grows(preset):
    speedups = [r.speedup for r in impl.sweep(preset, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(speedups, speedups[1:])), speedups
    assert speedups[-1] < speedups[0]


@pytest.mark.step3
@pytest.mark.parametrize("batch", sorted(LLAMA_TABLE))
def test_llama_preset_fits_the_articles_speedups_within_15_percent(batch):
    eager_ms, graph_ms = LLAMA_TABLE[batch]
    assert impl.simulate_step(LLAMA, batch).speedup == pytest.approx(eager_ms / graph_ms, rel=0.15)


@pytest.mark.step3
@pytest.mark.parametrize("batch", sorted(LLAMA_TABLE))
def test_llama_preset_step_times_are_roughly_the_table_milliseconds(batch):
    eager_ms, graph_ms = LLAMA_TABLE[batch]
    result = impl.simulate_step(LLAMA, batch)
    assert result.eager_us / 1e3 == pytest.approx(eager_ms, rel=0.20)
    assert result.graph_us / 1e3 == pytest.approx(graph_ms, rel=0.20)


@pytest.mark.step3
def test_smollm2_preset_keeps_its_illustrative_timing():
    result = impl.simulate_step(SMOLLM2, 1)
    assert result.eager_launches == 1394
    assert result.graph_launches == 1
    assert result.eager_us / 1e3 == pytest.approx(20.6, rel=0.10)
    assert result.graph_us / 1e3 == pytest.approx(2.87, rel=0.10)


@pytest.mark.step3
def test_ascii_rendering_draws_both_lanes_for_eager_and_graph():
    text = impl.render_ascii(LLAMA, batch=1, num_kernels=6, width=60)
    rows = [line for line in text.splitlines() if "|" in line]
    assert len(rows) == 4  # eager CPU, eager GPU, graph CPU, graph GPU
    eager_cpu, _, graph_cpu, graph_gpu = (row.split("|")[1] for row in rows)
    assert all(len(row.split("|")[1]) == 60 for row in rows)
    assert set("012345") <= set(eager_cpu), "eager issues every kernel on the CPU"
    assert set(graph_cpu) == {"=", "."}, "a replay issues one graph launch and nothing else"
    assert graph_gpu.rstrip(".").endswith("5"), "the GPU runs every node, the last one last"


# --- step 4: the crossover --------------------------------------------------------------------


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    check_predictions(
        answers,
        {
            "E_SPEEDUP_BATCH_6": reference.simulate_step(toy_e(reference), 6).speedup,
            "E_CROSSOVER_AT_2": reference.crossover_batch(toy_e(reference), 2.0, 64),
            "SMOLLM2_CROSSOVER_IS_NONE": reference.crossover_batch(reference.PRESETS[SMOLLM2_NAME])
            is None,
        },
    )


@pytest.mark.step4
def test_a_speedup_exactly_at_the_threshold_still_pays():
    # E's speedup is (10 + b) / (2 + b): 2.0 exactly at batch 6, below 2 from batch 7.
    toy = toy_e(impl)
    assert impl.simulate_step(toy, 6).speedup == 2.0
    assert impl.crossover_batch(toy, threshold=2.0, max_batch=64) == 7, (
        "a batch whose speedup equals the threshold still pays: graphs stop paying at the "
        "first batch whose speedup is below it"
    )


@pytest.mark.step4
def test_a_crossover_exactly_at_max_batch_is_found_and_one_batch_short_it_is_none():
    toy = toy_e(impl)
    assert impl.crossover_batch(toy, threshold=2.0, max_batch=7) == 7
    assert impl.crossover_batch(toy, threshold=2.0, max_batch=6) is None
    assert impl.crossover_batch(LLAMA, threshold=1.2, max_batch=17) == 17
    assert impl.crossover_batch(LLAMA, threshold=1.2, max_batch=16) is None


@pytest.mark.step4
def test_crossover_is_the_first_batch_whose_speedup_falls_below_the_threshold():
    for threshold in (1.05, 1.2):
        crossover = impl.crossover_batch(LLAMA, threshold=threshold)
        assert crossover is not None and crossover > 1
        assert impl.simulate_step(LLAMA, crossover).speedup < threshold
        assert impl.simulate_step(LLAMA, crossover - 1).speedup >= threshold
    assert impl.crossover_batch(LLAMA, threshold=1.2) < impl.crossover_batch(LLAMA, threshold=1.05)


@pytest.mark.step4
def test_crossover_on_a_toy_whose_speedup_is_known_at_every_batch():
    # 20 kernels of 0.05 µs a token behind 10 µs launches: the eager step stays near
    # 200 µs until the GPU work catches up with the launches (batch 200), while the
    # graph step is 10 + b µs. The first batch below each threshold is found by brute force.
    hw = hardware(launch_us=10.0, graph_launch_us=10.0, node_us=0.0, eager_gap_us=0.0)
    kernels = [impl.Kernel(f"k{i}", bytes_per_token=0.05e-6 * hw.bandwidth) for i in range(20)]
    preset = toy_preset(hw, kernels)
    speedups = {b: impl.simulate_step(preset, b).speedup for b in range(1, 801)}
    for threshold in (1.5, 1.1, 1.01):
        first = min(b for b, s in speedups.items() if s < threshold)
        assert impl.crossover_batch(preset, threshold=threshold, max_batch=800) == first


@pytest.mark.step4
def test_crossover_is_none_while_graphs_pay_and_one_when_they_never_do():
    # 1394 tiny kernels: graphs always pay up to batch 256
    assert impl.crossover_batch(SMOLLM2, max_batch=256) is None
    hw = hardware(launch_us=1.0, graph_launch_us=1.0, node_us=1.0)
    gpu_bound = toy_preset(hw, [tiny(f"k{i}", 500.0, hw) for i in range(4)])
    assert impl.crossover_batch(gpu_bound) == 1


@pytest.mark.step4
@pytest.mark.parametrize("threshold", [1.0, 0.9])
def test_crossover_threshold_must_be_a_speedup_above_one(threshold):
    with pytest.raises(ValueError):
        impl.crossover_batch(LLAMA, threshold=threshold)


@pytest.mark.step4
@pytest.mark.parametrize("max_batch", [0, -1, 64.0])
def test_crossover_max_batch_must_be_a_positive_integer(max_batch):
    with pytest.raises(ValueError):
        impl.crossover_batch(LLAMA, max_batch=max_batch)


@pytest.mark.step4
def test_crossover_simulates_a_few_dozen_batch_sizes_not_thousands(monkeypatch):
    simulated = []
    real = impl.simulate_step

    def counting(preset, batch):
        simulated.append(batch)
        return real(preset, batch)

    monkeypatch.setattr(impl, "simulate_step", counting)
    assert impl.crossover_batch(LLAMA, threshold=1.05) == 128
    assert impl.crossover_batch(SMOLLM2, max_batch=4096) is None
    assert 0 < len(simulated) <= 40, f"{len(simulated)} batch sizes simulated"


# --- step 5: presets by name ------------------------------------------------------------------


@pytest.mark.step5
def test_a_preset_is_found_by_its_name():
    assert impl.get_preset(LLAMA_NAME) is LLAMA
    assert impl.get_preset(SMOLLM2_NAME) is SMOLLM2
    assert impl.simulate_step(LLAMA_NAME, 4) == impl.simulate_step(LLAMA, 4)
    assert impl.crossover_batch(LLAMA_NAME) == impl.crossover_batch(LLAMA)


@pytest.mark.step5
def test_unknown_preset_raises_listing_the_preset_names():
    with pytest.raises(ValueError) as info:
        impl.get_preset("a100-llama-70b")
    message = str(info.value)
    assert "a100-llama-70b" in message
    assert LLAMA_NAME in message and SMOLLM2_NAME in message
    with pytest.raises(ValueError, match=LLAMA_NAME):
        impl.simulate_step("no-such-preset", 1)
