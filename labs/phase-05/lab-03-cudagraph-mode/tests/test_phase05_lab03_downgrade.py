"""Lab 03, step 2 — the downgrade: the requested mode against what attention supports."""

import pytest

import mini_vllm.config.compilation as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="config.py", reference="mini_vllm.config.compilation")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab03_answers"
)
M = impl.CUDAGraphMode
S = impl.AttentionCGSupport

pytestmark = pytest.mark.step2


def step2_scenario(modes):
    """The README's step 2 questions on `modes` (a module with the enums and
    resolve_cudagraph_mode): the names of the modes that run."""
    m, s = modes.CUDAGraphMode, modes.AttentionCGSupport
    resolve = modes.resolve_cudagraph_mode
    return (
        resolve(m.FULL_AND_PIECEWISE, s.UNIFORM_SINGLE_TOKEN_DECODE, True, 3).name,
        resolve(m.FULL_AND_PIECEWISE, s.UNIFORM_BATCH, True, 3).name,
        resolve(m.FULL_AND_PIECEWISE, s.UNIFORM_BATCH, False, 1).name,
    )


def test_your_step2_predictions_match_what_the_reference_computes():
    single_token, uniform_batch, no_split = step2_scenario(reference)
    check_predictions(
        answers,
        {
            "S2_SPEC_DECODE_SINGLE_TOKEN_BACKEND": single_token,
            "S2_SPEC_DECODE_UNIFORM_BATCH_BACKEND": uniform_batch,
            "S2_NO_SPLIT_UNIFORM_BATCH_BACKEND": no_split,
        },
    )


def test_the_readme_step2_scenario_runs_the_same_on_your_code():
    assert step2_scenario(impl) == step2_scenario(reference)


# (requested mode, attention support, attention split?, query len) -> resolved mode
DOWNGRADES = [
    # nothing to split around: no piecewise graphs
    ("PIECEWISE", "ALWAYS", False, 1, "NONE"),
    ("FULL_AND_PIECEWISE", "ALWAYS", False, 1, "FULL"),
    ("FULL_AND_PIECEWISE", "UNIFORM_BATCH", False, 1, "FULL_DECODE_ONLY"),
    # a backend that can do anything keeps what was asked
    ("FULL", "ALWAYS", True, 1, "FULL"),
    ("FULL", "ALWAYS", True, 4, "FULL"),
    ("FULL_AND_PIECEWISE", "ALWAYS", True, 1, "FULL_AND_PIECEWISE"),
    ("FULL_DECODE_ONLY", "UNIFORM_SINGLE_TOKEN_DECODE", False, 1, "FULL_DECODE_ONLY"),
    ("PIECEWISE", "NEVER", True, 1, "PIECEWISE"),
    ("NONE", "NEVER", False, 1, "NONE"),
    # FULL for mixed batches needs ALWAYS
    ("FULL", "UNIFORM_BATCH", True, 1, "FULL_AND_PIECEWISE"),
    ("FULL", "UNIFORM_BATCH", False, 1, "FULL_DECODE_ONLY"),
    ("FULL", "UNIFORM_SINGLE_TOKEN_DECODE", False, 1, "FULL_DECODE_ONLY"),
    # no full graphs at all
    ("FULL_DECODE_ONLY", "NEVER", True, 1, "PIECEWISE"),
    ("FULL_AND_PIECEWISE", "NEVER", True, 1, "PIECEWISE"),
    ("FULL_DECODE_ONLY", "NEVER", False, 1, "NONE"),
    # several query tokens a request (speculative decoding) need UNIFORM_BATCH
    ("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", True, 2, "PIECEWISE"),
    ("FULL_DECODE_ONLY", "UNIFORM_SINGLE_TOKEN_DECODE", False, 4, "NONE"),
    ("FULL", "UNIFORM_SINGLE_TOKEN_DECODE", True, 2, "PIECEWISE"),
    ("FULL_AND_PIECEWISE", "UNIFORM_BATCH", True, 4, "FULL_AND_PIECEWISE"),
    ("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", True, 1, "FULL_AND_PIECEWISE"),
]


@pytest.mark.parametrize("requested, support, split, q, expected", DOWNGRADES)
def test_downgrade_table(requested, support, split, q, expected):
    assert impl.resolve_cudagraph_mode(M[requested], S[support], split, q) is M[expected]


@pytest.mark.parametrize("q", [1, 2, 3, 8])
def test_downgrade_a_backend_exactly_at_the_support_decode_needs_keeps_full_decode(q):
    """The support a uniform decode batch needs: UNIFORM_SINGLE_TOKEN_DECODE for one token a
    request, UNIFORM_BATCH for q > 1. A backend that meets the need exactly keeps FULL for
    decode; one level below loses it."""
    exactly = S.UNIFORM_SINGLE_TOKEN_DECODE if q == 1 else S.UNIFORM_BATCH
    below = S(exactly - 1)
    assert impl.resolve_cudagraph_mode(M.FULL_AND_PIECEWISE, exactly, True, q) is (
        M.FULL_AND_PIECEWISE
    ), f"{exactly.name} is enough for q = {q}"
    assert impl.resolve_cudagraph_mode(M.FULL_DECODE_ONLY, exactly, False, q) is (
        M.FULL_DECODE_ONLY
    ), f"{exactly.name} is enough for q = {q}"
    assert impl.resolve_cudagraph_mode(M.FULL_AND_PIECEWISE, below, True, q) is M.PIECEWISE
    assert impl.resolve_cudagraph_mode(M.FULL_DECODE_ONLY, below, False, q) is M.NONE


@pytest.mark.parametrize("split", [True, False])
def test_downgrade_full_for_mixed_batches_on_a_never_backend_raises(split):
    with pytest.raises(ValueError):
        impl.resolve_cudagraph_mode(M.FULL, S.NEVER, split)


def test_downgrade_full_and_piecewise_without_split_on_a_never_backend_raises():
    # Without a split it is a request for FULL, and FULL for mixed batches needs ALWAYS.
    with pytest.raises(ValueError):
        impl.resolve_cudagraph_mode(M.FULL_AND_PIECEWISE, S.NEVER, False)


@pytest.mark.parametrize("support", list(S.__members__))
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("q", [1, 3])
def test_downgrade_result_is_something_the_backend_can_run(support, split, q):
    for requested in M:
        try:
            mode = impl.resolve_cudagraph_mode(requested, S[support], split, q)
        except ValueError:
            continue
        if mode.has_mode(M.PIECEWISE):
            assert split, f"{requested.name} -> {mode.name}: PIECEWISE needs the split"
        if mode.mixed_mode() is M.FULL:
            assert S[support] is S.ALWAYS
        if mode.decode_mode() is M.FULL:
            needed = S.UNIFORM_SINGLE_TOKEN_DECODE if q == 1 else S.UNIFORM_BATCH
            assert S[support] >= needed, f"{requested.name} -> {mode.name} on {support}"


def test_downgrade_accepts_a_mode_name():
    assert impl.resolve_cudagraph_mode("full", S.UNIFORM_BATCH, True) is M.FULL_AND_PIECEWISE


def test_downgrade_query_len_below_one_is_an_error():
    with pytest.raises(ValueError):
        impl.resolve_cudagraph_mode(M.FULL_AND_PIECEWISE, S.ALWAYS, True, 0)
