"""`bench decode --modes ...` on CPU (the CPU graph backend), tiny model: the report's shape."""

from __future__ import annotations

from mini_vllm.bench.decode_graphs import format_graph_markdown, run_graph_decode_bench


def test_graph_bench_reports_every_mode_and_batch_and_a_markdown_table():
    lines = []
    report = run_graph_decode_bench(
        "tiny",
        device="cpu",
        batch_sizes=[1, 2],
        modes=["eager", "full", "full+async"],
        context_len=8,
        steps=3,
        warmup=1,
        log=lines.append,
    )
    assert set(report.results) == {(b, m) for b in (1, 2) for m in ("eager", "full", "full+async")}
    for (_, mode), result in report.results.items():
        assert result.step_ms > 0 and result.forward_ms > 0
        assert result.runtime_mode == ("NONE" if mode == "eager" else "FULL")
    assert report.refit is None  # the simulator preset describes SmolLM2's shape only
    table = format_graph_markdown(
        report, "python -m mini_vllm bench decode --device cpu --model tiny"
    )
    assert "| 1 |" in table and "| 2 |" in table and "full step ms" in table
