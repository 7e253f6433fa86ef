"""The `simulate` command, and what the lab tests of the Phase 05 simulators do not cover.

- `python -m mini_vllm simulate`: its table, its crossover line, its errors;
- mini_vllm.cudagraph and mini_vllm.teaching.launch_overhead beyond the labs' behaviours;
- the labs' starters keep the reference's given code word for word, so a fix to the
  reference cannot leave a stale copy behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mini_vllm.__main__ import main
from mini_vllm.teaching import cudagraph, launch_overhead

ROOT = Path(__file__).resolve().parents[2]


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- the command ---------------------------------------------------------------------


def test_simulate_prints_one_row_per_batch_size_with_the_model_numbers(capsys):
    code, out, _ = simulate(capsys, "--preset", "h100-llama3.1-8b", "--batch-sizes", "4,1,16,4")
    assert code == 0
    table = out.split(" batch ", 1)[1].split("crossover:")[
        0
    ]  # between the header and the crossover line
    rows = [line.split() for line in table.splitlines()[1:] if line.strip()]
    assert [int(row[0]) for row in rows] == [1, 4, 16]  # sorted, de-duplicated
    for row in rows:
        expected = launch_overhead.simulate_step("h100-llama3.1-8b", int(row[0]))
        assert float(row[1]) == pytest.approx(expected.eager_us / 1e3, abs=0.01)
        assert float(row[2]) == pytest.approx(expected.graph_us / 1e3, abs=0.01)
        assert row[3] == f"{expected.speedup:.2f}x"
        assert (row[4], row[6]) == (
            str(len(launch_overhead.PRESETS["h100-llama3.1-8b"].kernels)),
            "1",
        )
    assert "8.40 -> 5.10 ms (1.65x)" in out  # the table row the preset was fitted to


def test_simulate_reports_the_crossover_batch(capsys):
    _, out, _ = simulate(capsys, "--preset", "h100-llama3.1-8b", "--batch-sizes", "1")
    crossover = launch_overhead.crossover_batch("h100-llama3.1-8b")
    assert f"graphs stop paying at batch {crossover} " in out
    _, out, _ = simulate(
        capsys, "--preset", "h100-llama3.1-8b", "--batch-sizes", "1", "--threshold", "1.2"
    )
    assert f"at batch {launch_overhead.crossover_batch('h100-llama3.1-8b', threshold=1.2)} " in out


def test_simulate_says_when_graphs_always_pay(capsys):
    _, out, _ = simulate(capsys, "--preset", "h100-smollm2-135m", "--batch-sizes", "1")
    assert "crossover: none up to batch 4096" in out


def test_simulate_ascii_draws_the_lanes_at_the_smallest_and_largest_batch(capsys):
    _, out, _ = simulate(capsys, "--preset", "h100-llama3.1-8b", "--batch-sizes", "1,64", "--ascii")
    assert "h100-llama3.1-8b, batch 1," in out and "h100-llama3.1-8b, batch 64," in out
    assert out.count("eager CPU |") == 2 and out.count("graph CPU |") == 2


def test_simulate_unknown_preset_is_one_line_listing_the_presets_and_exit_2(capsys):
    code, out, err = simulate(capsys, "--preset", "a100-nope")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown preset 'a100-nope'")
    assert all(name in lines[0] for name in launch_overhead.PRESETS)


@pytest.mark.parametrize("sizes", ["1,x", "0,4", "1,,2", "-1"])
def test_simulate_bad_batch_sizes_say_what_is_allowed(capsys, sizes):
    code, _, err = simulate(capsys, "--batch-sizes", sizes)
    assert code == 2
    assert "positive integers separated by commas" in err


def test_simulate_threshold_must_be_a_speedup(capsys):
    code, _, err = simulate(capsys, "--threshold", "0.9")
    assert code == 2 and "a finite number > 1.0" in err


def test_simulate_command_module_imports_nothing_heavy():
    probe = (
        "import sys, mini_vllm.cli.simulate; print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"


def test_simulate_runs_as_a_module():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_vllm",
            "simulate",
            "--preset",
            "h100-smollm2-135m",
            "--batch-sizes",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "1394 / 1" in result.stdout


# --- launch_overhead beyond lab 02 -----------------------------------------------------


def test_timeline_spans_are_plain_records_for_plotting():
    preset = launch_overhead.get_preset("h100-llama3.1-8b")
    spans = launch_overhead.eager_timeline(preset.kernels[:5], 1, preset.hardware)
    assert {s.lane for s in spans} == {"cpu", "gpu"}
    assert all(s.end_us > s.start_us >= 0 for s in spans)


def test_hardware_refuses_negative_costs():
    with pytest.raises(ValueError, match="launch_us"):
        launch_overhead.Hardware(-1.0, 1.0, 1.0, 1.0, 1e12, 1e15)


# --- cudagraph beyond lab 01 ------------------------------------------------------------


def test_graphs_on_one_device_share_its_pool():
    device = cudagraph.SimDevice()
    a = cudagraph.GraphRunner(cudagraph.toy_model(hidden=8), device)
    b = cudagraph.GraphRunner(cudagraph.toy_model(hidden=8, seed=1), device)
    a(np.ones((2, 8), np.float32))
    used = device.pool.nbytes
    b(np.ones((2, 8), np.float32))
    assert device.pool.nbytes > used > 0


def test_captures_do_not_nest_and_replay_is_refused_mid_capture():
    device = cudagraph.SimDevice()
    runner = cudagraph.GraphRunner(cudagraph.toy_model(hidden=8), device)
    runner(np.ones((1, 8), np.float32))
    with device.capture(cudagraph.CapturedGraph(device)):
        with pytest.raises(cudagraph.CaptureError, match="do not nest"):
            with device.capture(cudagraph.CapturedGraph(device)):
                pass
        with pytest.raises(cudagraph.CaptureError, match="capture is open"):
            runner.graphs[(1, 8)].replay()


def test_replay_moves_the_simulated_clock_by_one_launch_and_the_node_costs():
    device = cudagraph.SimDevice(launch_us=5.0, graph_launch_us=6.0, node_us=1.0)
    ops = cudagraph.toy_model(hidden=8, num_layers=2)
    runner = cudagraph.GraphRunner(ops, device)
    runner(np.ones((1, 8), np.float32))
    start = device.synchronize()  # otherwise the replay queues behind the GPU work still running
    runner(np.ones((1, 8), np.float32))
    assert device.clock_us - start == pytest.approx(6.0 + sum(op.gpu_us + 1.0 for op in ops))


def test_piecewise_runner_falls_back_to_eager_per_piece_after_the_window_closes():
    ops = cudagraph.toy_model(hidden=8, num_layers=2, attention=True)
    runner = cudagraph.PiecewiseGraphRunner(ops, cudagraph.SimDevice(), fallback_to_eager=True)
    runner(np.ones((2, 8), np.float32))
    runner.close_capture_window()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(
        runner(x), cudagraph.run_eager(ops, cudagraph.SimDevice(), x), rtol=1e-6
    )


def test_a_model_needs_ops():
    with pytest.raises(ValueError, match="at least one op"):
        cudagraph.GraphRunner([])
    with pytest.raises(TypeError, match="Op or Branch"):
        cudagraph.GraphRunner([lambda x: x])


def test_refit_matches_the_eager_step_and_prices_graph_nodes_from_the_eager_profile():
    from mini_vllm.teaching.launch_overhead import (
        GRAPH_NODE_GAP_US,
        kernel_gpu_us,
        refit_preset,
        simulate_step,
    )

    refit = refit_preset("h100-smollm2-135m", eager_ms=15.0, num_kernels=484)
    assert abs(len(refit.kernels) - 484) <= refit.shape["layers"]
    assert simulate_step(refit, 1).eager_us / 1000 == pytest.approx(15.0, rel=1e-6)
    assert refit.hardware.node_us == 2.0  # no profile: the preset's own node cost

    work_ms = sum(kernel_gpu_us(k, 1, refit.hardware) for k in refit.kernels) / 1000
    # Kernels that took exactly their roofline time leave only the gap between nodes.
    bare = refit_preset("h100-smollm2-135m", eager_ms=15.0, num_kernels=484, kernel_gpu_ms=work_ms)
    assert bare.hardware.node_us == pytest.approx(GRAPH_NODE_GAP_US)
    # Slower kernels make every node dearer by their mean excess, and the graph step longer.
    slow = refit_preset(
        "h100-smollm2-135m",
        eager_ms=15.0,
        num_kernels=484,
        kernel_gpu_ms=work_ms + len(refit.kernels) * 3e-3,
    )
    assert slow.hardware.node_us == pytest.approx(GRAPH_NODE_GAP_US + 3.0)
    assert simulate_step(slow, 1).graph_us > simulate_step(bare, 1).graph_us
    assert simulate_step(slow, 1).eager_us / 1000 == pytest.approx(15.0, rel=1e-6)
    with pytest.raises(ValueError, match="kernel_gpu_ms"):
        refit_preset("h100-smollm2-135m", eager_ms=15.0, num_kernels=484, kernel_gpu_ms=0.0)
