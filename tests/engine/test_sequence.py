"""A request's state: token counts, prefill vs decode, finishing."""

from __future__ import annotations

import pytest

from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus
from mini_vllm.sampling_params import SamplingParams


def test_new_sequence_waits_with_its_whole_prompt_to_compute():
    seq = Sequence("r", [5, 6, 7])
    assert seq.status is SequenceStatus.WAITING
    assert (seq.num_prompt_tokens, seq.num_tokens, seq.num_output_tokens) == (3, 3, 0)
    assert seq.num_new_tokens == 3 and seq.is_prefill
    assert seq.block_table == [] and seq.sampling_params == SamplingParams()


def test_prefill_then_decode_is_read_off_the_counters():
    seq = Sequence("r", [5, 6, 7, 8])
    seq.num_computed_tokens = 2  # a first chunk
    assert seq.is_prefill and seq.num_new_tokens == 2
    seq.num_computed_tokens = 4
    seq.append_token(9)
    assert not seq.is_prefill and seq.num_new_tokens == 1
    assert seq.token_ids == (5, 6, 7, 8, 9) and seq.output_token_ids == (9,)
    assert seq.last_token_id == 9 and seq.tokens(3, 5) == [8, 9]


def test_one_token_prompt_is_a_prefill_until_computed():
    seq = Sequence("r", [5])
    assert seq.num_new_tokens == 1 and seq.is_prefill


def test_recompute_after_preemption_is_a_prefill_over_prompt_and_outputs():
    seq = Sequence("r", [5, 6])
    seq.num_computed_tokens = 2
    for t in (7, 8, 9):
        seq.append_token(t)
        seq.num_computed_tokens = seq.num_tokens - 1
    seq.num_computed_tokens = 0  # preempted
    assert seq.is_prefill and seq.num_new_tokens == 5
    seq.num_computed_tokens = 3  # a chunk that ends inside the generated tokens
    assert seq.is_prefill
    seq.num_computed_tokens = 4
    assert not seq.is_prefill and seq.num_new_tokens == 1


def test_finished_sequence_takes_no_more_tokens():
    seq = Sequence("r", [1])
    seq.finish(FinishReason.LENGTH)
    assert seq.is_finished and seq.error is None
    with pytest.raises(RuntimeError, match="finished"):
        seq.append_token(2)


def test_error_message_goes_with_error_reason_only():
    with pytest.raises(ValueError):
        Sequence("r", [1]).finish(FinishReason.ERROR)
    with pytest.raises(ValueError):
        Sequence("r", [1]).finish(FinishReason.STOP, "why")
    seq = Sequence("r", [1])
    seq.finish(FinishReason.ERROR, "too long")
    assert seq.error == "too long"


@pytest.mark.parametrize(
    "prompt, error",
    [([], ValueError), ([1, -2], ValueError), ([1.5], TypeError), ([True], TypeError)],
)
def test_bad_prompts_are_refused(prompt, error):
    with pytest.raises(error):
        Sequence("r", prompt)


def test_numpy_integer_tokens_are_accepted():
    np = pytest.importorskip("numpy")
    seq = Sequence("r", np.array([3, 4]))
    seq.append_token(np.int64(5))
    assert seq.token_ids == (3, 4, 5) and all(type(t) is int for t in seq.token_ids)


def test_sampling_params_must_be_sampling_params():
    with pytest.raises(TypeError, match="SamplingParams"):
        Sequence("r", [1], {"max_tokens": 3})
