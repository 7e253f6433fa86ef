"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code.
"""

from __future__ import annotations

import predictions
import serving_metrics as mine


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"{name:24} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"{name:24} your code raised {type(exc).__name__}: {exc}")
        return
    if isinstance(value, float):
        value = round(value, 4)
    print(f"{name:24} your code: {value!r:<20} you predicted: {predicted!r}")


def record_r():
    """R: TTFT 250 ms, then chunks 40, 45 and 260 ms apart (the last carries two tokens),
    and the stream's end 5 ms after the last token."""
    return mine.RequestResult(
        success=True, prompt_len=8, output_tokens=5, ttft=0.25, itl=[0.04, 0.045, 0.26], latency=0.6
    )


def run_m():
    """M, a 2 s run: two one-token answers (TTFT 100 ms), a 5-token answer and a 3-token
    answer (TTFT 200 ms; gaps of 60 and 90 ms, one token a chunk, the stream ends with the
    last token), and one request that failed with HTTP 503."""
    one = dict(success=True, prompt_len=8, output_tokens=1, ttft=0.1, latency=0.1)
    return [
        mine.RequestResult(**one),
        mine.RequestResult(**one),
        mine.RequestResult(
            success=True, prompt_len=8, output_tokens=5, ttft=0.2, itl=[0.06] * 4, latency=0.44
        ),
        mine.RequestResult(
            success=True, prompt_len=8, output_tokens=3, ttft=0.2, itl=[0.09] * 2, latency=0.38
        ),
        mine.RequestResult(success=False, error="HTTP 503", prompt_len=8),
    ]


def main() -> None:
    print("Before step 1: the record R")
    show("R_TPOT_MS", lambda: mine.request_tpot(record_r()) * 1e3)
    show("R_MEETS_TPOT_90", lambda: mine.meets_slo(record_r(), {"tpot": 90.0}))
    show("R_MEETS_ITL_200", lambda: mine.meets_slo(record_r(), {"itl": 200.0}))

    print("\nBefore step 2: percentiles")
    four = [0.01, 0.02, 0.03, 0.04]
    sixteen = [ms / 1e3 for ms in range(1, 17)]
    show("P50_OF_10_20_30_40_MS", lambda: mine.latency_percentiles(four, [50])["p50"])
    show("P99_OF_1_TO_16_MS", lambda: mine.latency_percentiles(sixteen, [99])["p99"])

    print("\nBefore step 3: the run M")

    def report():
        return mine.calculate_metrics(run_m(), 2.0, [50], {"tpot": 80.0})

    show("M_TPOT_MEAN_MS", lambda: report()["tpot_ms"]["mean"])
    show("M_ITL_MEAN_MS", lambda: report()["itl_ms"]["mean"])
    show("M_REQUEST_THROUGHPUT", lambda: report()["request_throughput"])
    show("M_GOODPUT_TPOT_80", lambda: report()["goodput"])


if __name__ == "__main__":
    main()
