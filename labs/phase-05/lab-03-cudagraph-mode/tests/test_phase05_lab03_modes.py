"""Lab 03, step 1 — CUDAGraphMode's methods: single modes and (decode, mixed) pairs."""

import pytest

from labkit import implementation

impl = implementation(__file__, starter="config.py", reference="mini_vllm.config.compilation")
M = impl.CUDAGraphMode

pytestmark = pytest.mark.step1


def test_modes_separate_routine_only_for_pairs():
    assert [m.separate_routine() for m in M] == [False, False, False, True, True]


@pytest.mark.parametrize(
    "mode, decode, mixed",
    [
        ("NONE", "NONE", "NONE"),
        ("PIECEWISE", "PIECEWISE", "PIECEWISE"),
        ("FULL", "FULL", "FULL"),
        ("FULL_DECODE_ONLY", "FULL", "NONE"),
        ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE"),
    ],
)
def test_modes_decode_and_mixed_mode_of_each_member(mode, decode, mixed):
    assert M[mode].decode_mode() is M[decode]
    assert M[mode].mixed_mode() is M[mixed]


def test_modes_has_mode_looks_inside_pairs():
    assert M.FULL_AND_PIECEWISE.has_mode(M.PIECEWISE)
    assert M.FULL_AND_PIECEWISE.has_mode(M.FULL)
    assert not M.FULL_AND_PIECEWISE.has_mode(M.NONE)
    assert M.FULL_DECODE_ONLY.has_mode(M.NONE)
    assert not M.FULL_DECODE_ONLY.has_mode(M.PIECEWISE)
    assert M.FULL.has_mode(M.FULL) and not M.FULL.has_mode(M.PIECEWISE)
    assert M.NONE.has_mode(M.NONE) and not M.NONE.has_mode(M.FULL)


@pytest.mark.parametrize("pair", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_modes_has_mode_refuses_a_pair_as_its_argument(pair):
    with pytest.raises(ValueError):
        M.FULL.has_mode(M[pair])
    with pytest.raises(ValueError):
        M.FULL_AND_PIECEWISE.has_mode(M[pair])


def test_modes_piecewise_compilation_needed_exactly_when_piecewise_is_used():
    needs = {m.name for m in M if m.requires_piecewise_compilation()}
    assert needs == {"PIECEWISE", "FULL_AND_PIECEWISE"}


@pytest.mark.parametrize(
    "mode, largest",
    [
        ("NONE", "NONE"),
        ("PIECEWISE", "PIECEWISE"),
        ("FULL", "FULL"),
        ("FULL_DECODE_ONLY", "FULL"),
        ("FULL_AND_PIECEWISE", "FULL"),
    ],
)
def test_modes_max_mode_is_the_largest_mode_any_batch_uses(mode, largest):
    assert M[mode].max_cudagraph_mode() is M[largest]


def test_modes_full_graphs_whenever_some_batch_runs_full():
    assert {m.name for m in M if m.has_full_cudagraphs()} == {
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    }


def test_modes_only_single_modes_are_valid_at_runtime():
    assert {m.name for m in M if m.valid_runtime_modes()} == {"NONE", "PIECEWISE", "FULL"}
