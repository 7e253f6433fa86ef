"""Phase 06, lab 02 (serving metrics): the mistakes students make, and the lab's steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.bench.serve"
TPOT = "return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0"

MUTANTS = [
    # -- step 1: one request --
    Mutant(
        name="tpot over every token",
        mistake="TPOT divides the time after the first token by all the output tokens "
        "instead of the tokens after the first",
        module=MODULE,
        old=TPOT,
        new="return (r.latency - r.ttft) / r.output_tokens if r.output_tokens > 1 else 0.0",
    ),
    Mutant(
        name="tpot includes the first token's wait",
        mistake="TPOT divides the whole latency, TTFT included, by the tokens after the "
        "first, so a long queue or prefill shows up as slow decoding",
        module=MODULE,
        old=TPOT,
        new="return r.latency / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0",
    ),
    Mutant(
        name="tpot as the mean gap",
        mistake="TPOT is the mean of the request's ITL gaps, which are per chunk: a chunk "
        "that carries several tokens counts once, and the end of the stream is lost",
        module=MODULE,
        old=TPOT,
        new="return sum(r.itl) / len(r.itl) if r.itl else 0.0",
    ),
    Mutant(
        name="tpot from the gaps only",
        mistake="TPOT adds up the gaps instead of taking latency minus TTFT, so the time "
        "from the last token to the end of the stream is left out",
        module=MODULE,
        old=TPOT,
        new="return sum(r.itl) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0",
    ),
    Mutant(
        name="slo bound excluded",
        mistake="a request exactly at an SLO's bound is counted as missing it (< where <= "
        "is meant)",
        module=MODULE,
        old="return all(measured[k] * 1e3 <= slo for k, slo in slo_ms.items())",
        new="return all(measured[k] * 1e3 < slo for k, slo in slo_ms.items())",
    ),
    Mutant(
        name="any slo is enough",
        mistake="a request counts as good when it meets any one of the SLOs given instead "
        "of every one",
        module=MODULE,
        old="return all(measured[k] * 1e3 <= slo for k, slo in slo_ms.items())",
        new="return any(measured[k] * 1e3 <= slo for k, slo in slo_ms.items())",
    ),
    Mutant(
        name="slo compared in seconds",
        mistake="the request's timings (seconds) are compared with the SLOs (milliseconds) "
        "without converting, so every request meets every SLO",
        module=MODULE,
        old="return all(measured[k] * 1e3 <= slo for k, slo in slo_ms.items())",
        new="return all(measured[k] <= slo for k, slo in slo_ms.items())",
    ),
    Mutant(
        name="itl slo on the mean gap",
        mistake="the ITL SLO is checked against the request's mean gap instead of its "
        "largest, so a stall averaged over many quick gaps passes",
        module=MODULE,
        old='"itl": max(r.itl, default=0.0),',
        new='"itl": sum(r.itl) / len(r.itl) if r.itl else 0.0,',
    ),
    Mutant(
        name="failed requests meet the slo",
        mistake="a failed request is checked like any other: its timings are zero, so it "
        "meets every SLO and counts in the goodput",
        module=MODULE,
        old="    if not r.success:\n        return False\n    measured = {",
        new="    measured = {",
    ),
    Mutant(
        name="tpot needs three tokens",
        mistake="the TPOT guard is off by one at its limit (more than two tokens instead of "
        "more than one), so a two-token answer, which has one interval after its first "
        "token, gets no TPOT",
        module=MODULE,
        old=TPOT,
        new="return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 2 else 0.0",
    ),
    Mutant(
        name="largest gap by sorting the request's gaps",
        mistake="the largest gap is found by sorting the request's own list of gaps in place "
        "(list.sort()), which reorders the record the caller keeps",
        module=MODULE,
        old='"itl": max(r.itl, default=0.0),',
        new='"itl": (r.itl.sort(), r.itl[-1] if r.itl else 0.0)[1],',
    ),
    # -- step 2: percentiles --
    Mutant(
        name="nearest-rank percentiles",
        mistake="percentiles by nearest rank (the smallest value with at least p% of the "
        "values at or below it) where the contract says linear interpolation: a P99 of 16 "
        "requests becomes their maximum",
        module=MODULE,
        old="float(np.percentile(ms, p))",
        new='float(np.percentile(ms, p, method="inverted_cdf"))',
    ),
    Mutant(
        name="rank rounded, values unsorted",
        mistake="the percentile is the value at the rounded rank of the list as it came, "
        "neither sorted nor interpolated",
        module=MODULE,
        old="float(np.percentile(ms, p))",
        new="float(ms[round(p / 100 * (ms.size - 1))])",
    ),
    Mutant(
        name="percentiles left in seconds",
        mistake="the summary keeps the values in seconds though its keys and the report "
        "say milliseconds",
        module=MODULE,
        old="ms = np.asarray(values_s, dtype=float) * 1e3",
        new="ms = np.asarray(values_s, dtype=float)",
    ),
    Mutant(
        name="percentile keys as floats",
        mistake="the percentile's key is formatted with str(p), so 99.0 gives 'p99.0' and "
        "the report's 'p99' is missing",
        module=MODULE,
        old='out[f"p{p:g}"]',
        new='out[f"p{p}"]',
    ),
    Mutant(
        name="mean of no values",
        mistake="the mean of an empty list is taken as is (NaN) instead of 0.0",
        module=MODULE,
        old='out = {"mean": float(ms.mean()) if ms.size else 0.0}',
        new='out = {"mean": float(ms.mean())}',
    ),
    Mutant(
        name="percentiles sort the caller's list",
        mistake="the percentiles are computed after sorting the caller's list in place, so "
        "the caller's latencies come back in another order",
        module=MODULE,
        old="ms = np.asarray(values_s, dtype=float) * 1e3",
        new="values_s.sort()\n    ms = np.asarray(values_s, dtype=float) * 1e3",
    ),
    # -- step 3: the run --
    Mutant(
        name="latencies include failed requests",
        mistake="the TTFT and E2EL summaries take every request, so the failed ones' zero "
        "timings pull the latencies down",
        module=MODULE,
        old="    ttfts = [r.ttft for r in ok]",
        new="    ttfts = [r.ttft for r in results]",
    ),
    Mutant(
        name="itl as each request's mean gap",
        mistake="the ITL summary takes one mean gap per request instead of pooling every "
        "gap, so a stall is averaged away as in TPOT",
        module=MODULE,
        old="itls = [gap for r in ok for gap in r.itl]",
        new="itls = [sum(r.itl) / len(r.itl) for r in ok if r.itl]",
    ),
    Mutant(
        name="one-token requests in the tpot summary",
        mistake="the TPOT summary keeps the 0.0 of the requests with one token, which drag "
        "its mean and percentiles down",
        module=MODULE,
        old="latency_percentiles([t for t in tpots_all if t > 0], percentiles)",
        new="latency_percentiles(tpots_all, percentiles)",
    ),
    Mutant(
        name="tpot summary weighted by tokens",
        mistake="the TPOT summary counts a request once per token after its first (as if "
        "TPOT were a per-token value), so long answers outweigh short ones",
        module=MODULE,
        old="latency_percentiles([t for t in tpots_all if t > 0], percentiles)",
        new="latency_percentiles(\n"
        "            [request_tpot(r) for r in ok for _ in range(r.output_tokens - 1)], "
        "percentiles\n        )",
    ),
    Mutant(
        name="e2el summary drops one-token answers",
        mistake="the end-to-end latency summary takes only the requests that have a TPOT "
        "(two tokens or more), so the short answers' latencies are lost",
        module=MODULE,
        old="e2els = [r.latency for r in ok]",
        new="e2els = [r.latency for r in ok if r.output_tokens > 1]",
    ),
    Mutant(
        name="request throughput counts failures",
        mistake="the request throughput counts every request sent, failed ones included",
        module=MODULE,
        old='"request_throughput": len(ok) / duration,',
        new='"request_throughput": len(results) / duration,',
    ),
    Mutant(
        name="goodput as a share",
        mistake="the goodput is the share of requests that met the SLOs instead of good "
        "requests per second",
        module=MODULE,
        old='"goodput": None if good is None else good / duration,',
        new='"goodput": None if good is None else good / len(results),',
    ),
    Mutant(
        name="total tokens without the prompts",
        mistake="the total token throughput leaves out the prompt tokens",
        module=MODULE,
        old='"total_token_throughput": (input_tokens + output_tokens) / duration,',
        new='"total_token_throughput": output_tokens / duration,',
    ),
    Mutant(
        name="goodput zero without an slo",
        mistake="without an SLO the goodput is reported as 0 instead of None (no SLO, no "
        "goodput), which reads as 'nothing met it'",
        module=MODULE,
        old="    good = None\n    if goodput_slo_ms:",
        new="    good = 0\n    if goodput_slo_ms:",
    ),
]

STEPS = {
    1: [f"{MODULE}:request_tpot", f"{MODULE}:meets_slo"],
    2: [f"{MODULE}:latency_percentiles"],
    3: [f"{MODULE}:calculate_metrics"],
}
