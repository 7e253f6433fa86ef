"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code.
"""

from __future__ import annotations

import config
import cudagraph_dispatcher
import numpy as np
import piecewise
import predictions

D_LADDER = [1, 2, 4, 8, 16, 24, 32]  # the default ladder of max_num_seqs=16, budget 2048


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"  {name:37} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"  {name:37} your code raised {type(exc).__name__}: {exc}")
        return
    print(f"  {name:37} your code: {value!r:<20} you predicted: {predicted!r}")


def resolved(mode: str, support: str, split: bool, q: int) -> str:
    m, s = config.CUDAGraphMode, config.AttentionCGSupport
    return config.resolve_cudagraph_mode(m[mode], s[support], split, q).name


def dispatcher_d(mode: str = "FULL_AND_PIECEWISE", q: int = 1):
    """Dispatcher D: the ladder above, at most 16 requests, q tokens a request."""
    modes = cudagraph_dispatcher.CUDAGraphMode
    return cudagraph_dispatcher.CudagraphDispatcher(modes[mode], D_LADDER, 16, q)


def launches() -> tuple[int, int, int]:
    """An eager run, then a piecewise runner's first and second call with one batch size."""
    ops = piecewise.toy_model(hidden=16, num_layers=4, attention=True)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    device = piecewise.SimDevice()
    piecewise.run_eager(ops, device, x)
    eager = device.launches
    device = piecewise.SimDevice()
    runner = piecewise.PiecewiseGraphRunner(ops, device)
    runner(x)
    first = device.launches
    runner(x)
    print(f"  the second call's launches, in order: {device.trace[first:]}")
    return eager, first, device.launches - first


def main() -> None:
    print("Before step 2: the downgrade (your resolve_cudagraph_mode)")
    show(
        "S2_SPEC_DECODE_SINGLE_TOKEN_BACKEND",
        lambda: resolved("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", True, 3),
    )
    show(
        "S2_SPEC_DECODE_UNIFORM_BATCH_BACKEND",
        lambda: resolved("FULL_AND_PIECEWISE", "UNIFORM_BATCH", True, 3),
    )
    show(
        "S2_NO_SPLIT_UNIFORM_BATCH_BACKEND",
        lambda: resolved("FULL_AND_PIECEWISE", "UNIFORM_BATCH", False, 1),
    )

    full = cudagraph_dispatcher.CUDAGraphMode.FULL
    piecewise_mode = cudagraph_dispatcher.CUDAGraphMode.PIECEWISE
    print("\nBefore step 3: the keys of dispatcher D (your __init__)")
    show("S3_PIECEWISE_KEYS", lambda: len(dispatcher_d().keys[piecewise_mode]))
    show("S3_FULL_KEYS", lambda: len(dispatcher_d().keys[full]))
    show("S3_FULL_KEYS_Q2", lambda: len(dispatcher_d(q=2).keys[full]))

    print("\nBefore step 4: dispatch on D (your dispatch)")
    show("S4_MIXED_20_MODE", lambda: dispatcher_d().dispatch(20, False)[0].name)
    show("S4_MIXED_20_TOKENS", lambda: dispatcher_d().dispatch(20, False)[1].num_tokens)
    show("S4_MIXED_33_MODE", lambda: dispatcher_d().dispatch(33, False)[0].name)
    show(
        "S4_FULL_DECODE_ONLY_MIXED_20_MODE",
        lambda: dispatcher_d("FULL_DECODE_ONLY").dispatch(20, False)[0].name,
    )

    print("\nBefore step 6: launches of your PiecewiseGraphRunner")
    try:
        eager, first, second = launches()
    except NotImplementedError:
        print("  PiecewiseGraphRunner: not written yet")
        return
    except Exception as exc:  # a bug of a step in progress: say so
        print(f"  PiecewiseGraphRunner raised {type(exc).__name__}: {exc}")
        return
    show("S6_EAGER_LAUNCHES", lambda: eager)
    show("S6_FIRST_CALL_LAUNCHES", lambda: first)
    show("S6_SECOND_CALL_LAUNCHES", lambda: second)


if __name__ == "__main__":
    main()
