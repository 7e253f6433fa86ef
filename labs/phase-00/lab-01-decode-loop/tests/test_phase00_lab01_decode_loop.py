"""Phase 00, lab 01 — the decode loop: stop rules, top-k/top-p,
one forward, prefill + decode with a KV cache, timing.

The model is mini_vllm's `tiny` Llama (random weights, CPU, milliseconds a forward).
`Recorder` wraps it to see what the loop asks for: the token ids and positions of each
forward, the attention metadata in force, the logits handed back. It can also force a
token (an EOS) at a chosen forward, make a forward fail, or move a fake clock by a chosen
amount in a forward. The clock tests replace `time.perf_counter` with `FakeClock`, which
moves where real time passes in a request: in setting up its cache, in each forward and
in each draw of a token, so the TTFT and the gaps have exact expected values and a clock
read at the wrong moment shows. The no-cache reference (`recompute_logits`) is written
here, with mini_vllm's model and attention backend, so the loop is checked against the
model itself, not against your own `full_forward_logits`.
"""

import dataclasses
import sys
import time

import pytest
import torch
from torch import nn

import mini_vllm.layers.sampler as reference_sampler
import mini_vllm.teaching.decode_loop as reference_loop
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import get_forward_context, set_forward_context
from mini_vllm.layers.attention import attention_layers, bind_kv_caches
from mini_vllm.layers.sampler import make_generator
from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import ByteTokenizer

impl = implementation(
    __file__,
    starter="decode_loop.py",
    reference=[
        "mini_vllm.layers.sampler",
        "mini_vllm.engine.sequence",
        "mini_vllm.teaching.decode_loop",
    ],
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase00_lab01_answers"
)

EOS = 257  # the tiny model's end-of-sequence id
PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119]  # BOS + "Hello, w" as bytes


@pytest.fixture(scope="module")
def tiny():
    model, _, _ = load_model("tiny", device="cpu", dtype=torch.float32, seed=0)
    return model


@pytest.fixture(scope="module")
def tiny_bf16():
    model, _, _ = load_model("tiny", device="cpu", dtype=torch.bfloat16, seed=0)
    return model


def home(function):
    """The module `function` lives in (the starter, or the mini_vllm module it comes from):
    where the tests swap one of the names it calls for a stand-in."""
    return sys.modules[function.__module__]


class FakeClock:
    """Stands in for `time.perf_counter`: time moves only when a test moves it."""

    def __init__(self, start=1000.0):
        self.now = start

    def __call__(self):
        return self.now


class Recorder(nn.Module):
    """The tiny model, recording every forward; optionally forcing tokens, failing, or
    moving a fake clock."""

    def __init__(self, inner, force=None, clock=None, durations=None, fail_at=None):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.force = force or {}  # forward index -> token id made the argmax
        self.clock = clock  # a FakeClock, moved by `durations`
        self.durations = durations or {}  # forward index -> seconds the forward takes
        self.fail_at = fail_at  # forward index that raises
        self.calls = []  # per forward: (input ids, positions, attention metadata)
        self.logits = []  # per forward: the logits returned to the loop

    def forward(self, input_ids, positions):
        index = len(self.calls)
        self.calls.append(
            (input_ids.tolist(), positions.tolist(), get_forward_context().attn_metadata)
        )
        if index == self.fail_at:
            raise RuntimeError(f"forward {index} failed (on purpose)")
        if self.clock is not None:
            self.clock.now += self.durations.get(index, 0.0)
        return self.inner(input_ids, positions)

    def compute_logits(self, hidden_states):
        logits = self.inner.compute_logits(hidden_states)
        index = len(self.calls) - 1
        if index in self.force:
            logits = logits.clone()
            logits[:, self.force[index]] = 1e4
        self.logits.append(logits.detach().clone())
        return logits


def recompute_logits(model, token_ids):
    """Logits `[T, vocab]` of every position: one causal forward with a fresh cache, by hand."""
    cfg = model.config
    caches = allocate_contiguous_kv_caches(
        cfg.num_hidden_layers,
        1,
        len(token_ids),
        cfg.num_key_value_heads,
        cfg.head_dim,
        next(model.parameters()).dtype,
        "cpu",
    )
    bind_kv_caches(model, ContiguousAttentionBackend(), caches)
    try:
        with torch.inference_mode():
            ids = torch.tensor(token_ids)
            positions = torch.arange(len(token_ids))
            with set_forward_context(
                CUDAGraphMode.NONE, attn_metadata=ContiguousAttentionMetadata.prefill(1, len(ids))
            ):
                hidden = model(ids, positions)
            return model.compute_logits(hidden)
    finally:
        bind_kv_caches(model, None, None)


def greedy(max_tokens, ignore_eos=True):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


def no_cache_bound(model):
    return all(layer.kv_cache is None and layer.impl is None for layer in attention_layers(model))


def kept(row):
    return sorted(torch.isfinite(row).nonzero().flatten().tolist())


def step2_questions(apply_top_k_top_p):
    """The README's step 2 questions, answered by `apply_top_k_top_p`."""
    row = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]]).log()
    with_top_k = kept(apply_top_k_top_p(row, torch.tensor([3]), torch.tensor([0.7]))[0])
    without_top_k = kept(apply_top_k_top_p(row, torch.tensor([-1]), torch.tensor([0.7]))[0])
    equal = torch.zeros(1, 4)
    num_equal_kept = len(kept(apply_top_k_top_p(equal, torch.tensor([-1]), torch.tensor([0.5]))[0]))
    return with_top_k, without_top_k, num_equal_kept


def step5_questions(loop, model):
    """The README's step 5 questions, answered by `loop` (a module with `generate` and
    `full_forward_logits`): the 9-token prompt, greedy, max_tokens=7, EOS ignored; then
    max_tokens=50 under a context limit of 12."""
    rec = Recorder(model)
    result = loop.generate(rec, PROMPT, greedy(7))
    forwards = len(rec.calls)
    fed = sum(len(ids) for ids, _, _ in rec.calls)
    recount = Recorder(model)
    for k in range(result.num_generated):  # recompute the whole sequence for every token
        loop.full_forward_logits(recount, PROMPT + result.token_ids[:k])
    without_cache = sum(len(ids) for ids, _, _ in recount.calls)
    limited = Recorder(model)
    capped = loop.generate(limited, PROMPT, greedy(50), max_model_len=12)
    last_position = max(p for _, positions, _ in limited.calls for p in positions)
    return forwards, fed, without_cache, len(result.itl_s), capped.num_generated, last_position


# -- step 1: the stop rule ------------------------------------------------------------


@pytest.mark.step1
def test_check_stop_stops_on_eos():
    assert impl.check_stop(EOS, 3, SamplingParams(max_tokens=10), {EOS}) == "stop"


@pytest.mark.step1
def test_check_stop_stops_at_max_tokens_and_not_before():
    params = SamplingParams(max_tokens=10)
    assert impl.check_stop(5, 9, params, {EOS}) is None
    assert impl.check_stop(5, 10, params, {EOS}) == "length"


@pytest.mark.step1
def test_check_stop_ignore_eos_keeps_going_until_max_tokens():
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    assert impl.check_stop(EOS, 3, params, {EOS}) is None
    assert impl.check_stop(EOS, 10, params, {EOS}) == "length"


@pytest.mark.step1
def test_check_stop_eos_on_the_last_allowed_token_is_a_stop():
    assert impl.check_stop(EOS, 10, SamplingParams(max_tokens=10), {EOS, 2}) == "stop"
    assert (
        impl.check_stop(2, 4, SamplingParams(max_tokens=10), {EOS, 2}) == "stop"
    )  # any of several EOS ids


# -- step 2: top-k and top-p ----------------------------------------------------------


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    with_top_k, without_top_k, num_equal_kept = step2_questions(reference_sampler.apply_top_k_top_p)
    check_predictions(
        answers,
        {
            "S2_KEPT_WITH_TOP_K": with_top_k,
            "S2_KEPT_WITHOUT_TOP_K": without_top_k,
            "S2_EQUAL_LOGITS_KEPT": num_equal_kept,
        },
    )


@pytest.mark.step2
def test_the_readme_questions_come_out_the_same_on_your_filter():
    assert step2_questions(impl.apply_top_k_top_p) == step2_questions(
        reference_sampler.apply_top_k_top_p
    )


@pytest.mark.step2
def test_top_k_keeps_the_k_largest_logits_unchanged():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9]])
    out = impl.apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert kept(out[0]) == [1, 3]
    assert out[0, 1] == 2.0 and out[0, 3] == 1.5
    assert torch.isneginf(out[0, [0, 2, 4]]).all()


@pytest.mark.step2
def test_top_p_keeps_the_smallest_set_that_reaches_p():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log().repeat(3, 1)
    out = impl.apply_top_k_top_p(logits, torch.tensor([-1, -1, -1]), torch.tensor([0.4, 0.6, 0.9]))
    assert kept(out[0]) == [1]  # 0.5 alone reaches 0.4
    assert kept(out[1]) == [1, 3]  # 0.5 + 0.3 reaches 0.6
    assert kept(out[2]) == [0, 1, 3]  # 0.5 + 0.3 + 0.15 reaches 0.9


@pytest.mark.step2
def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([[1.0, 1.1, 0.9, 1.05]])
    out = impl.apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.01]))
    assert kept(out[0]) == [1]


@pytest.mark.step2
def test_top_p_is_applied_after_the_top_k_cut():
    # After top-k = 2 the survivors are renormalised to 4/7 and 3/7: the first alone
    # (0.57) reaches p = 0.5, so top-p keeps one token. On the uncut distribution 0.4
    # would not reach 0.5 and two would stay.
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    out = impl.apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.5]))
    assert kept(out[0]) == [0]


@pytest.mark.step2
def test_top_k_top_p_settings_are_per_row_and_off_keeps_everything():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    out = impl.apply_top_k_top_p(logits, torch.tensor([-1, 5, 0]), torch.tensor([1.0, 1.0, 1.0]))
    assert torch.equal(out[0], logits[0])  # -1: no top-k
    assert kept(out[1]) == sorted(logits[1].topk(5).indices.tolist())
    assert torch.equal(out[2], logits[2])  # 0: no top-k either


@pytest.mark.step2
def test_top_k_at_or_past_the_vocabulary_keeps_everything():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    out = impl.apply_top_k_top_p(logits, torch.tensor([50, 73]), torch.tensor([1.0, 1.0]))
    assert torch.equal(out, logits)


@pytest.mark.step2
def test_top_p_is_reached_when_the_mass_equals_p():
    # Four equal logits: probabilities of exactly 0.25 each. Two tokens reach 0.5 exactly,
    # so the third is not needed; one token reaches 0.25 exactly.
    logits = torch.zeros(3, 4)
    out = impl.apply_top_k_top_p(
        logits, torch.tensor([-1, -1, -1]), torch.tensor([0.5, 0.25, 0.75])
    )
    assert [len(kept(row)) for row in out] == [2, 1, 3], (
        "a set whose probability equals p reaches p: no further token is kept"
    )


@pytest.mark.step2
def test_the_filter_leaves_the_callers_logits_as_they_were():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(2))
    before = logits.clone()
    out = impl.apply_top_k_top_p(logits, torch.tensor([3, -1]), torch.tensor([1.0, 0.5]))
    assert torch.equal(logits, before), "the caller's logits changed: filter a copy"
    assert out.data_ptr() != logits.data_ptr()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.step2
def test_the_filter_keeps_the_logits_dtype(dtype):
    # Top-k 4 keeps 1.0, 0.75, 0.5 and 0.25 (probabilities about 0.35, 0.27, 0.21, 0.17);
    # the first three reach 0.8.
    logits = torch.tensor([[0.0, 0.25, -0.5, 0.75, -8.0, 1.0, -2.0, 0.5]], dtype=dtype)
    out = impl.apply_top_k_top_p(logits, torch.tensor([4]), torch.tensor([0.8]))
    assert out.dtype == dtype, f"{dtype} logits came back as {out.dtype}"
    assert kept(out[0]) == [3, 5, 7]
    assert torch.equal(out[0, [3, 5, 7]], logits[0, [3, 5, 7]]), "kept logits keep their values"


# -- step 3: one forward --------------------------------------------------------------


def bound_prefill(model, n):
    cfg = model.config
    caches = allocate_contiguous_kv_caches(
        cfg.num_hidden_layers, 1, n, cfg.num_key_value_heads, cfg.head_dim, torch.float32, "cpu"
    )
    bind_kv_caches(model, ContiguousAttentionBackend(), caches)
    return torch.tensor(PROMPT[:n]), torch.arange(n), ContiguousAttentionMetadata.prefill(1, n)


@pytest.mark.step3
def test_run_model_step_returns_logits_of_the_sample_rows_only(tiny):
    rec = Recorder(tiny)
    expected = recompute_logits(tiny, PROMPT[:6])
    ids, positions, metadata = bound_prefill(rec, 6)
    try:
        with torch.inference_mode():
            logits = impl.run_model_step(rec, ids, positions, metadata, torch.tensor([1, 5]))
    finally:
        bind_kv_caches(rec, None, None)
    assert logits.shape == (2, tiny.config.vocab_size)
    assert rec.logits[-1].shape[0] == 2, "the LM head must see only the rows to sample"
    torch.testing.assert_close(logits, expected[[1, 5]], rtol=1e-5, atol=1e-5)


@pytest.mark.step3
def test_run_model_step_without_sample_rows_returns_every_row(tiny):
    expected = recompute_logits(tiny, PROMPT[:6])
    ids, positions, metadata = bound_prefill(tiny, 6)
    try:
        with torch.inference_mode():
            logits = impl.run_model_step(tiny, ids, positions, metadata)
    finally:
        bind_kv_caches(tiny, None, None)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.step3
def test_run_model_step_puts_the_metadata_in_the_forward_context(tiny):
    rec = Recorder(tiny)
    ids, positions, metadata = bound_prefill(rec, 4)
    try:
        with torch.inference_mode():
            impl.run_model_step(rec, ids, positions, metadata, torch.tensor([3]))
    finally:
        bind_kv_caches(rec, None, None)
    assert rec.calls[0][2] is metadata


@pytest.mark.step3
def test_run_model_step_returns_the_sample_rows_in_the_order_asked(tiny):
    expected = recompute_logits(tiny, PROMPT[:6])
    ids, positions, metadata = bound_prefill(tiny, 6)
    try:
        with torch.inference_mode():
            logits = impl.run_model_step(tiny, ids, positions, metadata, torch.tensor([5, 0, 3]))
    finally:
        bind_kv_caches(tiny, None, None)
    torch.testing.assert_close(logits, expected[[5, 0, 3]], rtol=1e-5, atol=1e-5)


# -- step 4: the no-cache reference ---------------------------------------------------


@pytest.mark.step4
def test_full_forward_logits_has_one_row_per_token_and_matches_the_model(tiny):
    logits = impl.full_forward_logits(tiny, PROMPT)
    assert logits.shape == (len(PROMPT), tiny.config.vocab_size)
    torch.testing.assert_close(logits, recompute_logits(tiny, PROMPT), rtol=1e-5, atol=1e-5)


@pytest.mark.step4
def test_full_forward_logits_is_causal(tiny):
    whole = impl.full_forward_logits(tiny, PROMPT)
    for t in (0, 3, len(PROMPT) - 1):
        prefix = impl.full_forward_logits(tiny, PROMPT[: t + 1])
        torch.testing.assert_close(whole[t], prefix[-1], rtol=1e-5, atol=1e-5)


@pytest.mark.step4
def test_full_forward_logits_leaves_no_cache_bound(tiny):
    impl.full_forward_logits(tiny, PROMPT[:3])
    assert no_cache_bound(tiny)


@pytest.mark.step4
def test_full_forward_logits_unbinds_the_cache_when_the_forward_fails(tiny):
    with pytest.raises(RuntimeError, match="on purpose"):
        impl.full_forward_logits(Recorder(tiny, fail_at=0), PROMPT[:3])
    assert no_cache_bound(tiny), "a failing forward must not leave its cache bound to the model"


@pytest.mark.step4
def test_full_forward_logits_runs_a_bfloat16_model_in_its_own_dtype(tiny_bf16):
    logits = impl.full_forward_logits(tiny_bf16, PROMPT)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits, recompute_logits(tiny_bf16, PROMPT))  # bf16 tolerances
    assert no_cache_bound(tiny_bf16)


# -- step 5: the loop -----------------------------------------------------------------


@pytest.mark.step5
def test_your_step5_predictions_match_what_the_reference_computes(tiny):
    forwards, fed, without_cache, gaps, capped, last_position = step5_questions(
        reference_loop, tiny
    )
    check_predictions(
        answers,
        {
            "S5_FORWARDS": forwards,
            "S5_TOKEN_IDS_FED": fed,
            "S5_TOKEN_IDS_WITHOUT_CACHE": without_cache,
            "S5_NUM_GAPS": gaps,
            "S5_TOKENS_UNDER_LIMIT_12": capped,
            "S5_LAST_POSITION_FED": last_position,
        },
    )


@pytest.mark.step5
def test_the_readme_questions_come_out_the_same_on_your_loop(tiny):
    assert step5_questions(impl, tiny) == step5_questions(reference_loop, tiny)


@pytest.mark.step5
def test_the_loop_draws_through_your_top_k_top_p_filter(tiny, monkeypatch):
    """Your step 2 filter is the one the loop uses: swapped here for one that keeps only
    token 7, every token the loop draws must be 7."""
    seen = []

    def only_token_7(logits, top_k, top_p):
        seen.append((top_k.tolist(), [round(p, 6) for p in top_p.tolist()]))
        out = torch.full_like(logits, float("-inf"))
        out[:, 7] = logits[:, 7]
        return out

    monkeypatch.setattr(home(impl.apply_top_k_top_p), "apply_top_k_top_p", only_token_7)
    params = SamplingParams(
        temperature=1.0, top_k=5, top_p=0.9, max_tokens=4, seed=3, ignore_eos=True
    )
    result = impl.generate(tiny, PROMPT, params)
    assert seen == [([5], [0.9])] * 4, (
        "every draw must go through this file's apply_top_k_top_p, with the request's "
        f"top_k and top_p (calls seen: {seen})"
    )
    assert result.token_ids == [7] * 4


@pytest.mark.step5
def test_cached_decode_equals_full_recompute(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(12))
    assert len(result.token_ids) == 12
    full = recompute_logits(tiny, PROMPT + result.token_ids[:-1])
    start = len(PROMPT) - 1
    # the logits each step produced with the cache == the rows of one forward without it
    torch.testing.assert_close(torch.cat(rec.logits), full[start:], rtol=1e-4, atol=1e-4)
    assert result.token_ids == full[start:].argmax(-1).tolist()


@pytest.mark.step5
def test_greedy_first_token_is_the_argmax_of_the_last_prompt_position(tiny):
    result = impl.generate(tiny, PROMPT, greedy(1))
    assert result.token_ids == [int(recompute_logits(tiny, PROMPT)[-1].argmax())]


@pytest.mark.step5
def test_prefill_is_one_forward_over_the_whole_prompt(tiny):
    rec = Recorder(tiny)
    impl.generate(rec, PROMPT, greedy(3))
    ids, positions, _ = rec.calls[0]
    assert ids == PROMPT
    assert positions == list(range(len(PROMPT)))


@pytest.mark.step5
def test_decode_positions_advance_one_per_step(tiny):
    rec = Recorder(tiny)
    impl.generate(rec, PROMPT, greedy(6))
    assert [call[1] for call in rec.calls[1:]] == [[len(PROMPT) + k] for k in range(5)]


@pytest.mark.step5
def test_each_decode_step_feeds_back_the_token_just_sampled(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(6))
    assert [call[0] for call in rec.calls[1:]] == [[t] for t in result.token_ids[:-1]]


@pytest.mark.step5
def test_logits_are_computed_for_one_row_per_step(tiny):
    rec = Recorder(tiny)
    impl.generate(rec, PROMPT, greedy(5))
    assert [logits.shape[0] for logits in rec.logits] == [1] * 5, (
        "prefill too: only the last prompt token"
    )


@pytest.mark.step5
def test_n_new_tokens_cost_n_forwards(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(7))
    assert result.finish_reason == "length" and len(result.token_ids) == 7
    assert len(rec.calls) == 7, "the prefill gives the first token; no forward after the last one"


@pytest.mark.step5
def test_max_tokens_one_is_the_prefill_alone(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(1))
    assert len(result.token_ids) == 1 and len(rec.calls) == 1
    assert result.itl_s == [] and result.finish_reason == "length"


@pytest.mark.step5
def test_stops_on_eos_and_keeps_the_eos_token(tiny):
    rec = Recorder(tiny, force={2: EOS})
    result = impl.generate(rec, PROMPT, greedy(10, ignore_eos=False))
    assert result.finish_reason == "stop"
    assert len(result.token_ids) == 3 and result.token_ids[-1] == EOS
    assert len(rec.calls) == 3


@pytest.mark.step5
def test_eos_from_the_prefill_stops_at_once(tiny):
    rec = Recorder(tiny, force={0: EOS})
    result = impl.generate(rec, PROMPT, greedy(10, ignore_eos=False))
    assert result.token_ids == [EOS] and result.finish_reason == "stop" and len(rec.calls) == 1


@pytest.mark.step5
def test_ignore_eos_keeps_going_past_eos(tiny):
    rec = Recorder(tiny, force={1: EOS})
    result = impl.generate(rec, PROMPT, greedy(5, ignore_eos=True))
    assert len(result.token_ids) == 5 and result.token_ids[1] == EOS
    assert result.finish_reason == "length"


@pytest.mark.step5
def test_every_eos_id_of_the_model_stops(tiny):
    rec = Recorder(tiny, force={1: 5})
    rec.config = dataclasses.replace(tiny.config, eos_token_id=(EOS, 5))
    result = impl.generate(rec, PROMPT, greedy(10, ignore_eos=False))
    assert (
        result.token_ids[-1] == 5 and len(result.token_ids) == 2 and result.finish_reason == "stop"
    )


@pytest.mark.step5
def test_positions_stay_below_max_model_len(tiny):
    rec = Recorder(tiny)
    limit = len(PROMPT) + 4
    result = impl.generate(rec, PROMPT, greedy(50), max_model_len=limit)
    assert (result.num_generated, result.finish_reason) == (4, "length"), (
        "the request ends once prompt + new tokens fill the context limit"
    )
    assert max(p for call in rec.calls for p in call[1]) == limit - 2, (
        "the last token is sampled, never fed: the largest position fed is limit - 2"
    )


@pytest.mark.step5
def test_prompt_plus_output_never_passes_the_context_limit(tiny):
    """max_model_len is the longest sequence the engine serves, prompt and output
    together: a follow-up turn that sends the whole conversation back must still fit."""
    limit = len(PROMPT) + 2
    for prompt_len in (limit - 2, limit - 1, limit):
        prompt = (PROMPT * 2)[:prompt_len]
        try:
            result = impl.generate(tiny, prompt, greedy(50), max_model_len=limit)
        except ValueError:
            continue
        total = prompt_len + result.num_generated
        assert total <= limit, (
            f"a prompt of {prompt_len} tokens under max_model_len={limit} came back with "
            f"{result.num_generated} new token(s): {total} tokens in all, more than the "
            "context holds. Sending that sequence back as the next prompt would be refused."
        )


@pytest.mark.step5
def test_a_prompt_that_fills_the_context_is_refused_before_any_forward(tiny):
    rec = Recorder(tiny)
    try:
        impl.generate(rec, PROMPT, greedy(4), max_model_len=len(PROMPT))
    except ValueError:
        pass
    else:
        pytest.fail(
            "a prompt of max_model_len tokens was served; it leaves no room for a new token, "
            "and vLLM refuses it when the request arrives (ValueError)"
        )
    assert not rec.calls, "a prompt the limit cannot serve is refused before any forward"


@pytest.mark.step5
def test_a_prompt_longer_than_the_context_is_refused_before_any_forward(tiny):
    with pytest.raises(ValueError):
        impl.generate(tiny, PROMPT, greedy(4), max_model_len=len(PROMPT) - 2)
    rec = Recorder(tiny)
    with pytest.raises(ValueError):  # one token too many
        impl.generate(rec, PROMPT, greedy(4), max_model_len=len(PROMPT) - 1)
    assert not rec.calls, "a prompt longer than the limit is refused before any forward"


@pytest.mark.step5
def test_a_prompt_one_short_of_the_context_gets_exactly_one_token(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(4), max_model_len=len(PROMPT) + 1)
    assert (result.num_generated, result.finish_reason) == (1, "length")
    assert len(rec.calls) == 1, "one forward: the prefill; nothing is left to decode"


@pytest.mark.step5
def test_a_one_token_prompt_is_a_prefill_of_one_row(tiny):
    rec = Recorder(tiny)
    result = impl.generate(rec, [256], greedy(3), max_model_len=4)
    assert [call[1] for call in rec.calls] == [[0], [1], [2]]
    assert result.token_ids[0] == int(recompute_logits(tiny, [256])[-1].argmax())
    assert result.finish_reason == "length"


@pytest.mark.step5
def test_the_callers_prompt_is_left_as_it_was(tiny):
    prompt = list(PROMPT)
    result = impl.generate(tiny, prompt, greedy(4))
    assert prompt == PROMPT, "generate changed the caller's prompt list"
    assert result.prompt_token_ids == PROMPT
    assert impl.generate(tiny, tuple(PROMPT), greedy(4)).token_ids == result.token_ids


@pytest.mark.step5
def test_a_bfloat16_model_decodes_with_a_cache_of_its_own_dtype(tiny_bf16):
    result = impl.generate(tiny_bf16, PROMPT, greedy(3))
    assert result.num_generated == 3
    assert result.token_ids[0] == int(recompute_logits(tiny_bf16, PROMPT)[-1].argmax())


@pytest.mark.step5
def test_empty_prompt_is_refused(tiny):
    with pytest.raises(ValueError):
        impl.generate(tiny, [], greedy(4))


@pytest.mark.step5
def test_generate_unbinds_the_cache_when_done(tiny):
    impl.generate(tiny, PROMPT, greedy(3))
    assert no_cache_bound(tiny)


@pytest.mark.step5
def test_a_failing_forward_leaves_no_cache_bound(tiny):
    with pytest.raises(RuntimeError, match="on purpose"):
        impl.generate(Recorder(tiny, fail_at=2), PROMPT, greedy(5))
    assert no_cache_bound(tiny), "a failing forward must not leave its cache bound to the model"


@pytest.mark.step5
def test_seeded_sampling_is_reproducible(tiny):
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=1234, ignore_eos=True)
    first = impl.generate(tiny, PROMPT, params).token_ids
    again = impl.generate(tiny, PROMPT, params).token_ids
    other = impl.generate(tiny, PROMPT, dataclasses.replace(params, seed=4321)).token_ids
    assert first == again
    assert first != other


@pytest.mark.step5
def test_a_seeded_request_draws_from_one_generator_for_its_whole_life(tiny):
    # The draws must be those of ONE generator used from the first token to the last:
    # a generator made again at every step would repeat its first draw each time.
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=1234, ignore_eos=True)
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, params)
    assert len(rec.logits) == 8
    sampler, generator = impl.Sampler(), make_generator(params, "cpu")
    expected = [int(sampler(logits, [params], [generator])[0]) for logits in rec.logits]
    assert result.token_ids == expected


@pytest.mark.step5
def test_temperature_sampling_is_not_greedy_but_a_single_candidate_is(tiny):
    greedy_ids = impl.generate(tiny, PROMPT, greedy(8)).token_ids
    sampled = impl.generate(
        tiny, PROMPT, SamplingParams(temperature=1.0, max_tokens=8, seed=7, ignore_eos=True)
    )
    top1 = impl.generate(
        tiny,
        PROMPT,
        SamplingParams(temperature=1.0, top_k=1, max_tokens=8, seed=7, ignore_eos=True),
    )
    assert sampled.token_ids != greedy_ids
    assert top1.token_ids == greedy_ids


@pytest.mark.step5
def test_ttft_and_inter_token_latencies_are_measured(tiny):
    result = impl.generate(tiny, PROMPT, greedy(6))
    assert result.ttft_s > 0
    assert len(result.itl_s) == 5 and all(gap > 0 for gap in result.itl_s)
    assert result.total_s == pytest.approx(result.ttft_s + sum(result.itl_s))


@pytest.mark.step5
def test_ttft_runs_from_the_call_to_the_first_token_and_each_itl_between_two_tokens(
    tiny, monkeypatch
):
    # Time moves where it does in a real request: 0.5 s to set up the cache, 2 s for the
    # prefill, then 0.25, 0.5 and 0.125 s for the three decode steps, and 1/16 s for every
    # draw of a token. The call starts at t = 1000.
    clock = FakeClock(start=1000.0)
    monkeypatch.setattr(time, "perf_counter", clock)
    loop = home(impl.generate)
    allocate, sampler = loop.allocate_contiguous_kv_caches, loop.Sampler

    def slow_allocate(*args, **kwargs):
        clock.now += 0.5
        return allocate(*args, **kwargs)

    class SlowSampler(sampler):
        def forward(self, *args, **kwargs):
            clock.now += 0.0625
            return super().forward(*args, **kwargs)

    monkeypatch.setattr(loop, "allocate_contiguous_kv_caches", slow_allocate)
    monkeypatch.setattr(loop, "Sampler", SlowSampler)
    rec = Recorder(tiny, clock=clock, durations={0: 2.0, 1: 0.25, 2: 0.5, 3: 0.125})
    arrivals = []
    result = impl.generate(
        rec, PROMPT, greedy(4), on_token=lambda _token, _delta: arrivals.append(clock())
    )
    assert arrivals == [1002.5625, 1002.875, 1003.4375, 1003.625], (
        "each token streams as soon as it exists: after its draw, before the next forward"
    )
    assert result.ttft_s == pytest.approx(2.5625, abs=1e-9), (
        "TTFT = t(first token) - t(request arrival): setting up the cache (0.5 s), the "
        "prefill (2 s) and the first draw (1/16 s) are all in it, nothing after"
    )
    assert result.itl_s == pytest.approx([0.3125, 0.5625, 0.1875], abs=1e-9), (
        "ITL i = t(token i + 1) - t(token i): each gap runs from the token before, after "
        "its draw, to this token, after its own draw"
    )


@pytest.mark.step5
def test_on_token_streams_each_token_right_after_its_forward(tiny):
    rec = Recorder(tiny)
    seen = []
    result = impl.generate(
        rec,
        PROMPT,
        greedy(5),
        on_token=lambda token_id, delta: seen.append((token_id, len(rec.calls))),
    )
    assert [t for t, _ in seen] == result.token_ids
    assert [n for _, n in seen] == [1, 2, 3, 4, 5], (
        "token i must be streamed before forward i + 1 runs"
    )


@pytest.mark.step5
def test_with_a_tokenizer_the_text_is_the_decoded_tokens(tiny):
    tokenizer = ByteTokenizer(bos_token_id=256, eos_token_id=EOS)
    deltas = []
    result = impl.generate(
        tiny, PROMPT, greedy(6), tokenizer=tokenizer, on_token=lambda _t, d: deltas.append(d)
    )
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
    assert "".join(deltas) == result.text
