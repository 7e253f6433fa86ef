"""An exception anywhere in a step never leaves the engine unusable, in every CPU mode.

Faults are injected (mini_vllm/bench/reliability.py) into the forward, the sampler,
the scheduler, the update after the forward, a block allocation half-way through, and
(async scheduling) the arrival of a step's tokens; as a bug would (RuntimeError) and as
Ctrl-C would (KeyboardInterrupt). After each: the exception reaches the caller, no
request is left in the engine, no KV block stays held, the next call's outputs equal
each prompt served alone, and requests driven through the engine API, stepped on
after the fault, finish with the very tokens they would have had without it (seeded
sampling included). The CUDA-graph modes: tests/gpu/test_faults_cuda.py (GPU-REQ).
"""

from __future__ import annotations

import pytest

from mini_vllm.bench.reliability import (
    ENGINE_MODES,
    InjectedFault,
    fault_points,
    load_prompts,
    run_fault,
    run_load,
    solo_outputs,
)

PROMPTS, PARAMS = load_prompts(12, seed=1)


@pytest.fixture(scope="module")
def solo():
    return solo_outputs("tiny", PROMPTS, PARAMS)


def fault_cases():
    for mode in ENGINE_MODES:
        for point in fault_points(mode):
            for at_call in (1, 7):
                yield pytest.param(mode, point, at_call, id=f"{mode}-{point}-call{at_call}")


@pytest.mark.parametrize("exception", [InjectedFault, KeyboardInterrupt])
@pytest.mark.parametrize(("mode", "point", "at_call"), list(fault_cases()))
def test_a_fault_in_a_step_leaves_the_engine_serving(mode, point, at_call, exception, solo):
    result = run_fault(mode, point, at_call, PROMPTS, PARAMS, solo, exception=exception)
    assert result.fired, f"{point} was called fewer than {at_call} times: nothing was tested"
    assert result.raised_to_caller, "the exception was swallowed"
    assert not result.requests_left, "the failed call left its requests in the engine"
    assert result.blocks_leaked == 0
    assert not result.bricked, "the next call failed or its outputs differ from solo runs"
    assert result.resumed_equal_to_solo == result.num_requests


LOAD_PROMPTS, LOAD_PARAMS = load_prompts(200, seed=0)


@pytest.fixture(scope="module")
def load_solo():
    return solo_outputs("tiny", LOAD_PROMPTS, LOAD_PARAMS)


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_200_prompts_under_preemption_equal_each_prompt_alone(mode, load_solo):
    result = run_load(mode, LOAD_PROMPTS, LOAD_PARAMS, load_solo)
    assert result.num_preemptions > 0, "the cache never ran short: the load tests little"
    assert result.num_served == 200
    assert result.num_equal_to_solo == 200
    assert result.num_blocks_leaked == 0


def test_the_load_mixes_greedy_and_seeded_sampling_and_shares_prefixes():
    assert {p.greedy for p in LOAD_PARAMS} == {True, False}
    assert all(p.seed is not None for p in LOAD_PARAMS if not p.greedy)
    assert sum(p[:12] == LOAD_PROMPTS[0][:12] for p in LOAD_PROMPTS) >= 60
