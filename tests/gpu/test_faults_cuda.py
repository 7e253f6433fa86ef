"""A fault in a step leaves a CUDA-graph engine serving (GPU-REQ; the CPU modes:
tests/engine/test_faults.py).

Faults are injected at every point of each GPU engine mode (FULL graphs replayed for
decode, piecewise ones for mixed batches, seeded generators on the device); after each,
the engine holds no request and no KV block, and the requests resumed after the fault
finish with the tokens each prompt gets alone.
"""

from __future__ import annotations

import pytest

from mini_vllm.bench.reliability import GPU_ENGINE_MODES, fault_points, run_fault, solo_outputs
from tests.engine.test_faults import PARAMS, PROMPTS


@pytest.fixture(scope="module")
def solo_cuda():
    return solo_outputs("tiny", PROMPTS, PARAMS, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("mode", "point"), [(mode, point) for mode in GPU_ENGINE_MODES for point in fault_points(mode)]
)
def test_a_fault_leaves_a_cuda_graph_engine_serving(mode, point, solo_cuda):
    # FULL graphs replayed for decode, piecewise ones for mixed batches, the seeded
    # generators on the device: after the fault, the same tokens as solo runs.
    result = run_fault(mode, point, 4, PROMPTS, PARAMS, solo_cuda)
    assert result.fired and result.raised_to_caller and not result.requests_left
    assert result.blocks_leaked == 0 and not result.bricked
    assert result.resumed_equal_to_solo == result.num_requests
