"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code.
"""

from __future__ import annotations

import launch_overhead as mine
import predictions


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"{name:34} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"{name:34} your code raised {type(exc).__name__}: {exc}")
        return
    if isinstance(value, float):
        value = round(value, 4)
    print(f"{name:34} your code: {value!r:<12} you predicted: {predicted!r}")


def hardware_h() -> mine.Hardware:
    """H: 1 TB/s, 100 TFLOP/s; 10 µs a launch, 12 µs a graph launch, 1 µs a node, no gap."""
    return mine.Hardware(
        launch_us=10.0,
        graph_launch_us=12.0,
        eager_gap_us=0.0,
        node_us=1.0,
        bandwidth=1e12,
        peak_flops=1e14,
    )


def kernel_k() -> mine.Kernel:
    """K: 4 MB of weights, 20 MFLOP a token."""
    return mine.Kernel("K", weight_bytes=4e6, flops_per_token=2e7)


def toy_t() -> mine.Preset:
    """T: 37 kernels of 1 µs each (1 MB of weights at 1 TB/s), on H."""
    kernels = tuple(mine.Kernel(f"t{i}", weight_bytes=1e6) for i in range(37))
    return mine.Preset("T", "T", hardware_h(), kernels, {})


def toy_e() -> mine.Preset:
    """E: one kernel of b µs at batch b (1 byte a token at 1 MB/s); 10 µs to launch it,
    2 µs to launch its graph, no gap and no node cost."""
    hw = mine.Hardware(
        launch_us=10.0,
        graph_launch_us=2.0,
        eager_gap_us=0.0,
        node_us=0.0,
        bandwidth=1e6,
        peak_flops=1e15,
    )
    return mine.Preset("E", "E", hw, (mine.Kernel("e", bytes_per_token=1.0),), {})


def first_batch_slower_than_batch_1() -> int:
    at_1 = mine.kernel_gpu_us(kernel_k(), 1, hardware_h())
    return next(b for b in range(1, 1000) if mine.kernel_gpu_us(kernel_k(), b, hardware_h()) > at_1)


def main() -> None:
    print("Before step 1: the kernel K on hardware H")
    show("K_GPU_US_BATCH_1", lambda: mine.kernel_gpu_us(kernel_k(), 1, hardware_h()))
    show("K_GPU_US_BATCH_64", lambda: mine.kernel_gpu_us(kernel_k(), 64, hardware_h()))
    show("K_FIRST_BATCH_SLOWER_THAN_BATCH_1", first_batch_slower_than_batch_1)

    print("\nBefore step 2: the toy step T")
    t = toy_t()
    show(
        "T_EAGER_US",
        lambda: mine.step_time_us(mine.eager_timeline(t.kernels, 1, t.hardware)),
    )

    print("\nBefore step 3")
    show("T_GRAPH_US", lambda: mine.simulate_step(t, 1).graph_us)
    show("T_SPEEDUP", lambda: mine.simulate_step(t, 1).speedup)

    print("\nBefore step 4: the one-kernel step E, and the SmolLM2 preset")
    show("E_SPEEDUP_BATCH_6", lambda: mine.simulate_step(toy_e(), 6).speedup)
    show("E_CROSSOVER_AT_2", lambda: mine.crossover_batch(toy_e(), 2.0, 64))
    smollm2 = mine.PRESETS["h100-smollm2-135m"]
    show("SMOLLM2_CROSSOVER_IS_NONE", lambda: mine.crossover_batch(smollm2) is None)


if __name__ == "__main__":
    main()
