"""Lab 03 — CUDAGraphMode's methods and the downgrade rule."""

import pytest

from labkit import implementation

impl = implementation(__file__, starter="config.py", reference="mini_vllm.config.compilation")
M = impl.CUDAGraphMode
S = impl.AttentionCGSupport


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
    assert M.FULL.has_mode(M.FULL) and not M.FULL.has_mode(M.PIECEWISE)
    with pytest.raises(ValueError):
        M.FULL.has_mode(M.FULL_DECODE_ONLY)


def test_modes_piecewise_compilation_needed_exactly_when_piecewise_is_used():
    needs = {m.name for m in M if m.requires_piecewise_compilation()}
    assert needs == {"PIECEWISE", "FULL_AND_PIECEWISE"}


def test_modes_max_mode_and_full_graphs():
    assert M.FULL_DECODE_ONLY.max_cudagraph_mode() is M.FULL
    assert M.FULL_AND_PIECEWISE.max_cudagraph_mode() is M.FULL
    assert M.PIECEWISE.max_cudagraph_mode() is M.PIECEWISE
    assert {m.name for m in M if m.has_full_cudagraphs()} == {
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    }


def test_modes_only_single_modes_are_valid_at_runtime():
    assert {m.name for m in M if m.valid_runtime_modes()} == {"NONE", "PIECEWISE", "FULL"}


# (requested mode, attention support, attention split?, query len) -> resolved mode
DOWNGRADES = [
    # rule 0: nothing to split around
    ("PIECEWISE", "ALWAYS", False, 1, "NONE"),
    ("FULL_AND_PIECEWISE", "ALWAYS", False, 1, "FULL"),
    # a backend that can do anything keeps what was asked
    ("FULL", "ALWAYS", True, 1, "FULL"),
    ("FULL_AND_PIECEWISE", "ALWAYS", True, 1, "FULL_AND_PIECEWISE"),
    ("PIECEWISE", "NEVER", True, 1, "PIECEWISE"),
    # rule 1: FULL for mixed batches needs ALWAYS
    ("FULL", "UNIFORM_BATCH", True, 1, "FULL_AND_PIECEWISE"),
    ("FULL", "UNIFORM_SINGLE_TOKEN_DECODE", False, 1, "FULL_DECODE_ONLY"),
    # rule 2: no full graphs at all
    ("FULL_DECODE_ONLY", "NEVER", True, 1, "PIECEWISE"),
    ("FULL_AND_PIECEWISE", "NEVER", True, 1, "PIECEWISE"),
    ("FULL_DECODE_ONLY", "NEVER", False, 1, "NONE"),
    # rule 3: speculative decoding (q > 1) needs UNIFORM_BATCH
    ("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", True, 2, "PIECEWISE"),
    ("FULL_DECODE_ONLY", "UNIFORM_SINGLE_TOKEN_DECODE", False, 4, "NONE"),
    ("FULL_AND_PIECEWISE", "UNIFORM_BATCH", True, 4, "FULL_AND_PIECEWISE"),
    ("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", True, 1, "FULL_AND_PIECEWISE"),
    ("NONE", "NEVER", False, 1, "NONE"),
]


@pytest.mark.parametrize("requested, support, split, q, expected", DOWNGRADES)
def test_modes_downgrade_table(requested, support, split, q, expected):
    assert impl.resolve_cudagraph_mode(M[requested], S[support], split, q) is M[expected]


@pytest.mark.parametrize("split", [True, False])
def test_modes_full_for_mixed_batches_on_never_backend_raises(split):
    with pytest.raises(ValueError):
        impl.resolve_cudagraph_mode(M.FULL, S.NEVER, split)
