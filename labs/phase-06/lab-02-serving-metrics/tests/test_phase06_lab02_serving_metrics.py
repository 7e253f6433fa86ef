"""Phase 06, lab 02 — the serving benchmark's metrics: TPOT, SLOs, percentiles, the run's
report.

Timings are multiples of a power of two where a test compares at a bound, so that
seconds times 1000 is exact and "at the bound" means exactly at it.

The requests built here end their stream a little after their last token, as a real
stream does (the usage chunk and `[DONE]` come after it): a TPOT or a latency rebuilt
from the gaps alone misses that tail, and the tests see it.
"""

import copy
import random

import numpy as np
import pytest

import mini_vllm.bench.serve as reference
from labkit import implementation
from labpredict import Approx, check_predictions

impl = implementation(__file__, starter="serving_metrics.py", reference="mini_vllm.bench.serve")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase06_lab02_answers"
)

TAIL = 1 / 64  # seconds from the last token to the end of the stream


def req(ttft, itl=(), tokens=None, latency=None, success=True, prompt_len=8):
    """A successful request: `tokens` defaults to one per chunk, `latency` to the last
    token plus the stream's tail."""
    itl = list(itl)
    return impl.RequestResult(
        success=success,
        error="" if success else "HTTP 503: the engine is warming up",
        prompt_len=prompt_len,
        output_tokens=len(itl) + 1 if tokens is None else tokens,
        ttft=ttft,
        itl=itl,
        latency=ttft + sum(itl) + TAIL if latency is None else latency,
    )


def failed(prompt_len=8):
    """A request that failed at once: no token, timings all zero."""
    return impl.RequestResult(
        success=False, error="HTTP 503: the engine is warming up", prompt_len=prompt_len
    )


# --- the README's scenarios, built on the reference for the prediction tests ------------


def record_r():
    """The README's record R: five tokens in four chunks, the last chunk carries two."""
    return reference.RequestResult(
        success=True, prompt_len=8, output_tokens=5, ttft=0.25, itl=[0.04, 0.045, 0.26], latency=0.6
    )


def run_m():
    """The README's run M (2 s): two one-token answers, answers of 5 and 3 tokens with
    gaps of 60 and 90 ms (one token a chunk, the stream ends with the last token), and
    one request that failed."""
    one = dict(success=True, prompt_len=8, output_tokens=1, ttft=0.1, latency=0.1)
    return [
        reference.RequestResult(**one),
        reference.RequestResult(**one),
        reference.RequestResult(
            success=True, prompt_len=8, output_tokens=5, ttft=0.2, itl=[0.06] * 4, latency=0.44
        ),
        reference.RequestResult(
            success=True, prompt_len=8, output_tokens=3, ttft=0.2, itl=[0.09] * 2, latency=0.38
        ),
        reference.RequestResult(success=False, error="HTTP 503", prompt_len=8),
    ]


# --- step 1: one request ---------------------------------------------------------------


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes():
    r = record_r()
    check_predictions(
        answers,
        {
            "R_TPOT_MS": reference.request_tpot(r) * 1e3,
            "R_MEETS_TPOT_90": reference.meets_slo(r, {"tpot": 90.0}),
            "R_MEETS_ITL_200": reference.meets_slo(r, {"itl": 200.0}),
        },
    )


@pytest.mark.step1
def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it():
    r = req(0.25, tokens=5, latency=1.25, itl=[0.25] * 4)
    assert impl.request_tpot(r) == pytest.approx(0.25)


@pytest.mark.step1
def test_tpot_counts_tokens_not_chunks_so_it_is_not_the_mean_gap():
    # Five tokens in three chunks: the first alone, then two chunks of two tokens.
    r = req(0.25, itl=[0.125, 0.125], tokens=5, latency=0.5)
    assert impl.request_tpot(r) == pytest.approx(0.25 / 4)  # the mean gap is 0.125


@pytest.mark.step1
def test_tpot_includes_the_end_of_the_stream_after_the_last_token():
    # The last token at 0.5 s, the stream's end (usage chunk, [DONE]) at 0.625 s.
    r = req(0.25, itl=[0.125, 0.125], tokens=3, latency=0.625)
    assert impl.request_tpot(r) == pytest.approx(0.375 / 2)


@pytest.mark.step1
def test_tpot_of_a_two_token_request_is_all_the_time_after_its_first_token():
    # Exactly at the limit: one token after the first, so one interval, tail included.
    r = req(0.25, itl=[0.125], tokens=2, latency=0.4375)
    assert impl.request_tpot(r) == pytest.approx(0.1875)


@pytest.mark.step1
@pytest.mark.parametrize("tokens", [1, 0])
def test_tpot_of_a_request_with_fewer_than_two_tokens_is_zero(tokens):
    r = req(0.5, tokens=tokens, latency=0.625)
    assert impl.request_tpot(r) == 0.0


@pytest.mark.step1
def test_a_request_exactly_at_its_bound_meets_it():
    r = req(0.5, itl=[0.0625, 0.125], latency=0.75)
    assert impl.meets_slo(r, {"ttft": 500.0}) is True
    assert impl.meets_slo(r, {"e2el": 750.0}) is True
    assert impl.meets_slo(r, {"itl": 125.0}) is True
    assert impl.meets_slo(r, {"tpot": 125.0}) is True  # 0.25 s over 2 tokens


@pytest.mark.step1
def test_slo_bounds_are_milliseconds_and_a_request_over_one_misses_it():
    r = req(0.5, itl=[0.0625, 0.125], latency=0.75)
    assert impl.meets_slo(r, {"ttft": 499.0}) is False
    assert impl.meets_slo(r, {"e2el": 749.0}) is False
    assert impl.meets_slo(r, {"itl": 124.0}) is False
    assert impl.meets_slo(r, {"tpot": 124.0}) is False


@pytest.mark.step1
def test_every_objective_given_must_hold():
    r = req(0.25, itl=[0.0625] * 8, latency=0.75)
    assert impl.meets_slo(r, {"ttft": 500.0, "e2el": 1000.0}) is True
    assert impl.meets_slo(r, {"ttft": 500.0, "e2el": 700.0}) is False
    assert impl.meets_slo(r, {"ttft": 200.0, "e2el": 1000.0}) is False


@pytest.mark.step1
def test_the_itl_objective_is_checked_against_the_largest_gap():
    # Seven quick gaps and one stall (a step that carried another request's prefill):
    # the mean gap is 58.6 ms, the largest 250 ms.
    r = req(0.25, itl=[0.03125] * 7 + [0.25])
    assert impl.meets_slo(r, {"itl": 100.0}) is False
    assert impl.meets_slo(r, {"itl": 250.0}) is True


@pytest.mark.step1
def test_the_tpot_objective_averages_the_stall_that_the_itl_objective_catches():
    r = req(0.25, itl=[0.03125] * 7 + [0.25])  # 9 tokens, 484.375 ms after the first
    assert impl.meets_slo(r, {"tpot": 61.0}) is True  # 60.55 ms a token
    assert impl.meets_slo(r, {"itl": 61.0}) is False


@pytest.mark.step1
def test_a_one_token_request_meets_tpot_and_itl_objectives_but_not_a_missed_ttft():
    r = req(0.125, tokens=1, latency=0.125)
    assert impl.meets_slo(r, {"tpot": 1.0, "itl": 1.0}) is True
    assert impl.meets_slo(r, {"tpot": 1.0, "itl": 1.0, "ttft": 100.0}) is False


@pytest.mark.step1
def test_a_failed_request_meets_no_objective_though_its_timings_are_zero():
    assert impl.meets_slo(failed(), {"ttft": 500.0}) is False
    assert impl.meets_slo(failed(), {}) is False


@pytest.mark.step1
def test_no_objective_asks_for_nothing():
    assert impl.meets_slo(req(30.0, itl=[5.0]), {}) is True


@pytest.mark.step1
def test_checking_a_request_leaves_its_gaps_in_the_order_they_came():
    gaps = [0.25, 0.03125, 0.0625]
    r = req(0.25, itl=gaps)
    for slo in ({"itl": 300.0}, {"itl": 100.0, "tpot": 200.0}):
        impl.meets_slo(r, slo)
        impl.request_tpot(r)
    assert r.itl == [0.25, 0.03125, 0.0625], "the request's own gaps were reordered"


# --- step 2: percentiles ---------------------------------------------------------------


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    sixteen = [ms / 1e3 for ms in range(1, 17)]
    check_predictions(
        answers,
        {
            "P50_OF_10_20_30_40_MS": reference.latency_percentiles([0.01, 0.02, 0.03, 0.04], [50])[
                "p50"
            ],
            "P99_OF_1_TO_16_MS": reference.latency_percentiles(sixteen, [99])["p99"],
        },
    )


@pytest.mark.step2
def test_percentiles_interpolate_linearly_between_the_closest_ranks():
    out = impl.latency_percentiles([0.04, 0.01, 0.03, 0.02], [50, 90, 99])
    assert set(out) == {"mean", "p50", "p90", "p99"}
    assert out["mean"] == pytest.approx(25.0)
    assert out["p50"] == pytest.approx(25.0), (
        "the P50 of 10, 20, 30, 40 ms: the report's percentile sits at rank p / 100 * (n - 1) "
        "of the sorted values and interpolates between the two values around it"
    )
    assert out["p90"] == pytest.approx(37.0)  # rank 2.7: 30 + 0.7 * 10
    assert out["p99"] == pytest.approx(39.7)  # rank 2.97


@pytest.mark.step2
def test_p99_of_sixteen_requests_lies_between_the_two_largest():
    values = [ms / 1e3 for ms in range(1, 17)]  # 1, 2, ..., 16 ms
    random.Random(0).shuffle(values)
    out = impl.latency_percentiles(values, [50, 90, 99])
    assert out["p50"] == pytest.approx(8.5)  # rank 7.5
    assert out["p90"] == pytest.approx(14.5)  # rank 13.5
    assert out["p99"] == pytest.approx(15.85), "rank 14.85: between 15 and 16 ms, not the maximum"


@pytest.mark.step2
def test_p0_and_p100_are_the_smallest_and_the_largest():
    out = impl.latency_percentiles([0.3, 0.1, 0.2], [0, 100])
    assert out["p0"] == pytest.approx(100.0)
    assert out["p100"] == pytest.approx(300.0)


@pytest.mark.step2
def test_percentile_keys_are_written_in_their_shortest_form():
    out = impl.latency_percentiles([0.001, 0.002], [50.0, 99.0, 99.9, 2.5])
    assert set(out) == {"mean", "p50", "p99", "p99.9", "p2.5"}


@pytest.mark.step2
def test_no_values_give_zeros():
    out = impl.latency_percentiles([], [50.0, 99.0])
    assert out == {"mean": 0.0, "p50": 0.0, "p99": 0.0}


@pytest.mark.step2
def test_one_value_is_every_percentile():
    out = impl.latency_percentiles([0.0125], [1, 50, 99.9])
    assert all(v == pytest.approx(12.5) for v in out.values())


@pytest.mark.step2
def test_percentiles_leave_the_callers_list_in_its_order():
    values = [0.04, 0.01, 0.03, 0.02]
    impl.latency_percentiles(values, [50, 99])
    assert values == [0.04, 0.01, 0.03, 0.02], "the caller's list was sorted in place"


@pytest.mark.step2
@pytest.mark.parametrize("seed", range(5))
def test_percentiles_match_numpys_default_on_skewed_latencies(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    values = (rng.lognormal(-3.0, 0.8, size=n)).tolist()  # mostly ~50 ms, a long tail
    pcts = [1, 25, 50, 75, 90, 95, 99, 99.9]
    out = impl.latency_percentiles(values, pcts)
    ms = np.asarray(values) * 1e3
    assert out["mean"] == pytest.approx(ms.mean(), rel=1e-12)
    for p in pcts:
        assert out[f"p{p:g}"] == pytest.approx(np.percentile(ms, p), rel=1e-12), p


# --- step 3: the run -------------------------------------------------------------------


PCTS = [50, 90, 99]


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    m = reference.calculate_metrics(run_m(), 2.0, [50], {"tpot": 80.0})
    check_predictions(
        answers,
        {
            "M_TPOT_MEAN_MS": m["tpot_ms"]["mean"],
            "M_ITL_MEAN_MS": m["itl_ms"]["mean"],
            "M_REQUEST_THROUGHPUT": m["request_throughput"],
            "M_GOODPUT_TPOT_80": Approx(m["goodput"]),
        },
    )


@pytest.mark.step3
def test_failed_requests_are_counted_but_left_out_of_latencies_and_throughput():
    results = [
        req(0.25, itl=[0.0625] * 3, prompt_len=10),  # E2EL 453.125 ms with the tail
        failed(prompt_len=100),
        req(0.5, itl=[0.125] * 3, prompt_len=20),  # E2EL 890.625 ms
    ]
    m = impl.calculate_metrics(results, 2.0, PCTS)
    assert (m["completed"], m["failed"], m["duration_s"]) == (2, 1, 2.0)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 8
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["ttft_ms"]["mean"] == pytest.approx(375.0)
    assert m["ttft_ms"]["p50"] == pytest.approx(375.0)
    assert m["e2el_ms"]["mean"] == pytest.approx((453.125 + 890.625) / 2)


@pytest.mark.step3
def test_throughputs_are_per_second_of_the_run():
    results = [req(0.25, itl=[0.0625], prompt_len=30), req(0.25, itl=[0.0625] * 2, prompt_len=50)]
    m = impl.calculate_metrics(results, 4.0, PCTS)
    assert m["request_throughput"] == pytest.approx(0.5)
    assert m["output_throughput"] == pytest.approx(5 / 4)
    assert m["total_token_throughput"] == pytest.approx((80 + 5) / 4)


@pytest.mark.step3
def test_itl_pools_every_gap_of_every_request():
    steady = req(0.25, itl=[0.03125] * 30)
    stalled = req(0.25, itl=[0.03125] * 2 + [0.25])
    m = impl.calculate_metrics([steady, stalled], 10.0, [50, 99, 100])
    gaps_ms = np.asarray(steady.itl + stalled.itl) * 1e3
    assert m["itl_ms"]["p100"] == pytest.approx(250.0), (
        "the 250 ms stall a reader of the second stream waited through is not in the ITL "
        "summary: is an ITL one value a request, or one value a gap?"
    )
    assert m["itl_ms"]["mean"] == pytest.approx(gaps_ms.mean())
    assert m["itl_ms"]["p50"] == pytest.approx(31.25)
    assert m["itl_ms"]["p99"] == pytest.approx(np.percentile(gaps_ms, 99))


@pytest.mark.step3
def test_tpot_summary_takes_one_value_a_request_and_leaves_out_requests_of_one_token():
    results = [
        req(0.125, itl=[0.0625] * 4, latency=0.375),  # 5 tokens, TPOT 62.5 ms
        req(0.125, itl=[0.125] * 2, latency=0.375),  # 3 tokens, TPOT 125 ms
        req(0.0625, tokens=1, latency=0.0625),  # no TPOT
        req(0.0625, tokens=1, latency=0.0625),
    ]
    m = impl.calculate_metrics(results, 1.0, PCTS)
    assert m["tpot_ms"]["mean"] == pytest.approx(93.75), (
        "the mean of 62.5 and 125 ms: each request that has a TPOT counts once, however long, "
        "and a one-token answer, which has none, is not a TPOT of 0"
    )
    assert m["tpot_ms"]["p50"] == pytest.approx(93.75)


@pytest.mark.step3
def test_short_requests_stay_in_the_ttft_and_e2el_summaries():
    results = [
        req(0.125, itl=[0.0625] * 4, latency=0.375),
        req(0.125, itl=[0.125] * 2, latency=0.375),
        req(0.0625, tokens=1, latency=0.0625),  # a one-token answer: a TTFT and an E2EL
        req(0.0625, tokens=1, latency=0.0625),
    ]
    m = impl.calculate_metrics(results, 1.0, PCTS)
    assert m["ttft_ms"]["mean"] == pytest.approx(93.75)
    assert m["e2el_ms"]["mean"] == pytest.approx(218.75)
    assert m["e2el_ms"]["p50"] == pytest.approx(218.75)


@pytest.mark.step3
def test_a_prefill_stall_lifts_the_itl_tail_far_above_the_tpot_tail():
    # Eight requests of 33 tokens; each decodes at 50 ms a token but one of its steps
    # also prefilled a newcomer and took 250 ms: 8 stalls among 256 gaps. Each stream
    # ends with its last token, 1800 ms after its first: every TPOT is 1800 / 32 ms.
    results = [
        req(0.25, itl=[0.05] * (i + 10) + [0.25] + [0.05] * (21 - i), latency=0.25 + 1.8)
        for i in range(8)
    ]
    m = impl.calculate_metrics(results, 4.0, PCTS)
    assert m["tpot_ms"]["p99"] == pytest.approx(56.25)
    assert m["itl_ms"]["p99"] == pytest.approx(250.0)
    assert m["itl_ms"]["p50"] == pytest.approx(50.0)


@pytest.mark.step3
def test_goodput_is_good_requests_per_second_of_the_run():
    results = [
        req(0.25, itl=[0.0625] * 4),  # good
        req(0.75, itl=[0.0625] * 4),  # TTFT over 500 ms
        req(0.25, itl=[0.0625, 0.5]),  # a 500 ms gap over 200 ms
        req(0.5, itl=[0.125] * 2),  # good: exactly at the TTFT bound
        failed(),
        failed(),
    ]
    m = impl.calculate_metrics(results, 4.0, PCTS, {"ttft": 500.0, "itl": 200.0})
    assert m["num_good"] == 2
    assert m["goodput"] == pytest.approx(0.5)
    assert m["request_throughput"] == pytest.approx(1.0)


@pytest.mark.step3
@pytest.mark.parametrize("slo", [None, {}])
def test_goodput_is_none_when_no_objective_is_given(slo):
    m = impl.calculate_metrics([req(0.25, itl=[0.0625])], 1.0, PCTS, slo)
    assert m["goodput"] is None and m["num_good"] is None


@pytest.mark.step3
def test_a_run_where_every_request_failed_reports_zeros():
    m = impl.calculate_metrics([failed(), failed()], 3.0, PCTS, {"ttft": 1000.0})
    assert (m["completed"], m["failed"], m["num_good"]) == (0, 2, 0)
    assert m["goodput"] == 0.0 and m["output_throughput"] == 0.0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert m[key] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}, key


@pytest.mark.step3
def test_the_report_leaves_the_requests_as_they_were():
    results = [
        req(0.25, itl=[0.25, 0.03125, 0.0625]),
        req(0.125, itl=[0.0625, 0.5, 0.03125], prompt_len=20),
        failed(),
    ]
    before = copy.deepcopy(results)
    impl.calculate_metrics(results, 2.0, PCTS, {"itl": 300.0, "tpot": 200.0})
    assert results == before, "calculate_metrics changed the requests it was given"
