"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code.
"""

from __future__ import annotations

import cudagraph as mine
import numpy as np
import predictions

HIDDEN = 16


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"{name:36} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"{name:36} your code raised {type(exc).__name__}: {exc}")
        return
    if isinstance(value, np.generic):
        value = value.item()
    print(f"{name:36} your code: {value!r:<12} you predicted: {predicted!r}")


def the_input(batch: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, HIDDEN)).astype(np.float32)


def eager_device(node_us: float = 1.5):
    """A fresh device after one eager run of the 8-op toy model on a (4, 16) input."""
    device = mine.SimDevice(node_us=node_us)
    mine.run_eager(mine.toy_model(hidden=HIDDEN, num_layers=2), device, the_input())
    return device


def captured(node_us: float = 1.5):
    """A fresh device, the graph of the 8 ops captured on a (4, 16) input, its output."""
    device = mine.SimDevice(node_us=node_us)
    graph = mine.CapturedGraph(device)
    with device.capture(graph):
        out = the_input()
        for op in mine.toy_model(hidden=HIDDEN, num_layers=2):
            out = device.launch(op, out)
    return device, graph, out


def replayed_clock(node_us: float = 1.5) -> float:
    device, graph, _ = captured(node_us)
    graph.replay()
    return device.clock_us


def runner_scenario():
    """A GraphRunner called with (4, 16), (4, 16), (8, 16), (4, 16): the device, what
    each call returned (copied at once), and the array the first call returned."""
    device = mine.SimDevice()
    runner = mine.GraphRunner(mine.toy_model(hidden=HIDDEN, num_layers=2), device)
    inputs = [the_input(4, 40), the_input(4, 41), the_input(8, 42), the_input(4, 43)]
    first = runner(inputs[0])
    outputs = [first.copy()] + [runner(x).copy() for x in inputs[1:]]
    return device, outputs, first


def first_result_holds() -> int | None:
    _, outputs, first = runner_scenario()
    calls = [i + 1 for i, out in enumerate(outputs) if np.array_equal(first, out)]
    return calls[-1] if calls else None


def main() -> None:
    print("Before step 1: the toy model on one (4, 16) input")
    show("EAGER_HOST_US", lambda: eager_device().host_us)
    show("EAGER_CLOCK_US", lambda: eager_device().clock_us)
    show("CAPTURE_POOL_BYTES", lambda: captured()[0].pool.nbytes)
    show("OUTPUT_IS_NAN_AFTER_CAPTURE", lambda: bool(np.isnan(captured()[2]).all()))

    print("\nBefore step 2: replay that graph once")
    show("REPLAY_CLOCK_US", replayed_clock)
    show(
        "REPLAY_BEATS_EAGER_WITH_NODE_US_3",
        lambda: replayed_clock(3.0) < eager_device(3.0).clock_us,
    )

    print("\nBefore step 3: a runner called with (4, 16), (4, 16), (8, 16), (4, 16)")
    show("RUNNER_LAUNCHES", lambda: runner_scenario()[0].launches)
    show("RUNNER_CAPTURES", lambda: runner_scenario()[0].captures)
    show("RUNNER_POOL_BYTES", lambda: runner_scenario()[0].pool.nbytes)
    show("FIRST_RESULT_HOLDS_CALL", first_result_holds)


if __name__ == "__main__":
    main()
