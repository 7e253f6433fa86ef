"""Phase 00, lab 01 — the decode loop: stop rules, top-k/top-p,
one forward, prefill + decode with a KV cache, timing.

The model is mini_vllm's `tiny` Llama (random weights, CPU, milliseconds a forward).
`Recorder` wraps it to see what the loop asks for: the token ids and positions of each
forward, the attention metadata in force, the logits handed back. It can also force a
token (an EOS) at a chosen forward, make a forward fail, or move a fake clock by a chosen
amount in a forward (the clock tests replace `time.perf_counter` with `FakeClock`, so the
TTFT and the gaps have exact expected values and no test depends on real timing).
The no-cache reference (`recompute_logits`) is written here, with mini_vllm's model and
attention backend, so the loop is checked against the model itself, not against your
own `full_forward_logits`.
"""

import dataclasses
import time

import pytest
import torch
from torch import nn

from labkit import implementation
from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import get_forward_context, set_forward_context
from mini_vllm.layers.attention import attention_layers, bind_kv_caches
from mini_vllm.layers.sampler import Sampler, make_generator
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

EOS = 257  # the tiny model's end-of-sequence id
PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119]  # BOS + "Hello, w" as bytes


@pytest.fixture(scope="module")
def tiny():
    model, _, _ = load_model("tiny", device="cpu", dtype=torch.float32, seed=0)
    return model


class FakeClock:
    """Stands in for `time.perf_counter`: time moves only when a `Recorder` moves it."""

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
        torch.float32,
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


def kept(row):
    return sorted(torch.isfinite(row).nonzero().flatten().tolist())


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


# -- step 5: the loop -----------------------------------------------------------------


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
    assert result.finish_reason == "length"
    assert len(result.token_ids) >= 4
    assert max(p for call in rec.calls for p in call[1]) < limit, (
        "a position at or past the limit has no cache slot"
    )


@pytest.mark.step5
def test_prompt_that_does_not_fit_is_refused(tiny):
    with pytest.raises(ValueError):
        impl.generate(tiny, PROMPT, greedy(4), max_model_len=len(PROMPT) - 2)
    rec = Recorder(tiny)
    with pytest.raises(ValueError):  # one token too many
        impl.generate(rec, PROMPT, greedy(4), max_model_len=len(PROMPT) - 1)
    assert not rec.calls, "a prompt longer than the limit is refused before any forward"


@pytest.mark.step5
def test_a_prompt_of_exactly_the_limit_gets_one_token(tiny):
    """The limit counts positions, and the last token never takes one: it is sampled, not
    fed back. So a prompt that fills every position still gets its token (vLLM's rule,
    and the engine's of Phase 03), and the request ends there on the length."""
    rec = Recorder(tiny)
    result = impl.generate(rec, PROMPT, greedy(4), max_model_len=len(PROMPT))
    assert (len(result.token_ids), result.finish_reason) == (1, "length")
    assert len(rec.calls) == 1, "one forward: the prefill; nothing is left to decode"
    assert max(p for call in rec.calls for p in call[1]) < len(PROMPT)


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
    sampler, generator = Sampler(), make_generator(params, "cpu")
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
    # Only the forwards take time on this clock: 2 s for the prefill, then 0.25, 0.5
    # and 0.125 s for the three decode steps. The call starts at t = 1000.
    clock = FakeClock(start=1000.0)
    monkeypatch.setattr(time, "perf_counter", clock)
    rec = Recorder(tiny, clock=clock, durations={0: 2.0, 1: 0.25, 2: 0.5, 3: 0.125})
    arrivals = []
    result = impl.generate(
        rec, PROMPT, greedy(4), on_token=lambda _token, _delta: arrivals.append(clock())
    )
    assert arrivals == [1002.0, 1002.25, 1002.75, 1002.875], "each token streams as it exists"
    assert result.ttft_s == pytest.approx(2.0, abs=1e-9), (
        "TTFT = t(first token) - t(request arrival): the prefill is in it, nothing after"
    )
    assert result.itl_s == pytest.approx([0.25, 0.5, 0.125], abs=1e-9), (
        "ITL i = t(token i + 1) - t(token i): each gap is measured from the token before, "
        "not from the request's start"
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
