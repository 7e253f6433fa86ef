"""Mixed prefill+decode steps: the tokens each request gets, and the attention of one step.

A step of continuous batching may hold prefill chunks of new prompts beside the decodes
of running requests ("mixed steps"); a prompt longer than the step's token budget is
split into chunks, the later ones starting after tokens already in the cache. Checked
here, on the tiny model in float32 on the CPU (CPU-OK; the CUDA side:
tests/gpu/test_mixed_steps_cuda.py):

1. Batched equals solo: each request's tokens, greedy or seeded, when many run together
   equal its tokens when it runs alone, for long prompts in many chunks, short and long
   prompts together, under preemption and with prefix caching (each run asserts the thing
   it is about happened: chunks beside decodes, preemptions, prefix hits).
2. Graphs equal eager: with FULL_AND_PIECEWISE or PIECEWISE asked for (the CPU recording
   graphs) a scripted workload whose mixed steps are padded to every rung of a small
   ladder gives the enforce_eager engine's tokens; the step records prove every rung ran.
   So do 64 staggered long prompts on the default ladder up to 512 tokens, and the
   preemption and prefix-caching runs of 1.
3. A mixed step's attention: the paged backend's output for prefill chunks of 1 to 100
   tokens (first and later chunks) beside decodes, with padded rows, against a dense
   float64 causal softmax per request (grouped-query heads), and the KV it writes.
   Only the backend's public `forward` and the metadata constructor are used; the
   metadata is built in one place, `paged_metadata`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm import SamplingParams
from mini_vllm.attention.paged import (
    PagedAttentionBackend,
    PagedAttentionMetadata,
    allocate_paged_kv_caches,
)
from mini_vllm.config.capture_sizes import padded_size
from tests.engine.test_cudagraph_runner import make_llm

MAX_MODEL_LEN = 256  # the tiny model's context
LADDER = [1, 2, 4, 8, 16, 32, 64]


# -- requests -------------------------------------------------------------------------


def params(kind: str, index: int, max_tokens: int = 10) -> SamplingParams:
    """Greedy, or seeded sampling with a seed of the request's own."""
    if kind == "greedy":
        return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return SamplingParams(
        temperature=0.9, top_k=40, seed=1000 + index, max_tokens=max_tokens, ignore_eos=True
    )


def prompts_between(n: int, seed: int, shortest: int, longest: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(shortest, longest))] for _ in range(n)]


def short_and_long(seed: int) -> list[list[int]]:
    """Short prompts (1-12 tokens) and long ones (120-230) interleaved, arriving together."""
    short = prompts_between(7, seed, 1, 12)
    long = prompts_between(6, seed + 1, 120, 230)
    return [p for pair in zip(short, long) for p in pair] + short[len(long) :]


def shared_prefixes(seed: int) -> list[list[int]]:
    """Three prefixes of 48-130 tokens, each with four different tails of 1-40 tokens."""
    rng = random.Random(seed)
    heads = prompts_between(3, seed, 48, 130)
    return [
        heads[i % 3] + [rng.randrange(256) for _ in range(rng.randint(1, 40))] for i in range(12)
    ]


@cache
def _solo_engine():
    return make_llm("cpu", max_num_seqs=1, max_model_len=MAX_MODEL_LEN)


@cache
def _solo(prompt: tuple[int, ...], sampling: SamplingParams) -> tuple[int, ...]:
    return tuple(_solo_engine().generate([list(prompt)], sampling, use_tqdm=False)[0].token_ids)


def solo_tokens(prompts, sampling: list[SamplingParams]) -> list[list[int]]:
    """Each prompt run alone (one request in the engine, the whole prompt in one step)."""
    return [list(_solo(tuple(p), s)) for p, s in zip(prompts, sampling)]


def record_schedules(llm, monkeypatch) -> list:
    """Every SchedulerOutput the engine runs from now on, in order."""
    outputs = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        output = schedule()
        outputs.append(output)
        return output

    monkeypatch.setattr(llm.engine.scheduler, "schedule", recording)
    return outputs


def mixed_records(llm) -> list:
    """Step records of the steps that computed prefill and decode tokens together."""
    return [s for s in llm.stats.steps if s.num_prefill_tokens and s.num_decode_tokens]


# -- 1. batched equals solo -------------------------------------------------------------

# name -> (prompts, engine options). Every engine is float32 on the CPU, blocks of 4.
SCENARIOS = {
    # 100-230 tokens in chunks of at most 32: 4 to 8 chunks a prompt, beside decodes.
    "long-prompts-many-chunks": (
        lambda: prompts_between(10, seed=1, shortest=100, longest=230),
        dict(max_num_seqs=8, max_num_batched_tokens=32),
    ),
    "short-and-long-together": (
        lambda: short_and_long(seed=2),
        dict(max_num_seqs=12, max_num_batched_tokens=64),
    ),
    # 100 blocks of 4 tokens hold 400: the longest request (230 + 10) fits alone, but a
    # few long requests together do not, so the scheduler must preempt and recompute.
    "preemption": (
        lambda: prompts_between(12, seed=3, shortest=60, longest=230),
        dict(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=100),
    ),
    "prefix-caching": (
        lambda: shared_prefixes(seed=4),
        dict(max_num_seqs=6, max_num_batched_tokens=32, enable_prefix_caching=True),
    ),
    "prefix-caching+preemption": (
        lambda: shared_prefixes(seed=5),
        dict(
            max_num_seqs=8,
            max_num_batched_tokens=48,
            enable_prefix_caching=True,
            num_kv_blocks=72,
        ),
    ),
}


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_batched_mixed_steps_equal_each_request_alone(scenario, kind, monkeypatch):
    make_prompts, options = SCENARIOS[scenario]
    prompts = make_prompts()
    sampling = [params(kind, i) for i in range(len(prompts))]
    llm = make_llm("cpu", max_model_len=MAX_MODEL_LEN, **options)
    schedules = record_schedules(llm, monkeypatch)
    outputs = llm.generate(prompts, sampling, use_tqdm=False)

    assert [o.token_ids for o in outputs] == solo_tokens(prompts, sampling)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert llm.engine.block_manager.num_used_blocks == 0

    # The run did what it is named for; otherwise the equality above proves little.
    budget = options["max_num_batched_tokens"]
    stats = llm.stats
    assert mixed_records(llm), "no step mixed prefill and decode tokens"
    assert all(s.num_tokens <= budget for s in stats.steps)
    # A later chunk (tokens of its request already cached) ran beside a decode.
    assert any(
        any(r.is_prefill and r.num_computed_tokens > 0 for r in out.scheduled)
        and any(not r.is_prefill for r in out.scheduled)
        for out in schedules
    ), "no later prefill chunk ran beside a decode"
    chunks = Counter(r.seq_id for out in schedules for r in out.scheduled if r.is_prefill)
    first_rows = {}
    for out in schedules:
        for r in out.scheduled:
            first_rows.setdefault(r.seq_id, r)
    prompt_tokens = sum(len(p) for p in prompts)
    if scenario == "long-prompts-many-chunks":
        assert min(chunks.values()) >= 4 and max(chunks.values()) >= 7
    if "preemption" in scenario:
        assert stats.num_preemptions > 0, "no request was preempted: the cache is too big"
    else:
        assert stats.num_preemptions == 0
    if "prefix-caching" in scenario:
        # A prefix hit: a request's first row starts after tokens it did not compute.
        hits = [r for r in first_rows.values() if r.num_computed_tokens > 0]
        assert len(hits) >= 6, "too few prefix-cache hits"
        assert any(r.num_new_tokens > 1 for r in hits)  # a first chunk at a cached offset
        if stats.num_preemptions == 0:
            cached = sum(r.num_computed_tokens for r in hits)
            assert stats.prefill_tokens == prompt_tokens - cached
    else:
        assert all(r.num_computed_tokens == 0 for r in first_rows.values())
        if stats.num_preemptions == 0:
            assert stats.prefill_tokens == prompt_tokens


# -- 2. every graph mode equals eager, at every rung of the ladder ------------------------


@dataclass(frozen=True)
class Arrival:
    step: int  # added just before this engine step (0: the first)
    prompt: tuple[int, ...]
    params: SamplingParams


def ladder_workload(seed: int = 0, kind_of=lambda i: "greedy") -> list[Arrival]:
    """Requests arriving one step after another so that the mixed steps have
    1, 2, 3, 5, 12, 22, 64, 64, 40, 12, 39, 11, 32 tokens (decodes of the requests running
    + the new prompt or the next chunk of the long one): padded to every rung of LADDER,
    some exactly and some with padded rows. Then the requests end at different steps, so
    uniform decodes of many sizes follow. The step records prove the counts."""
    rng = random.Random(seed)
    plan = [  # (step, prompt length)
        (0, 1),  # alone: a 1-token prefill, 1 token
        (1, 1),  # 1 decode + 1 = 2
        (2, 1),  # 2 + 1 = 3 -> 4
        (3, 2),  # 3 + 2 = 5 -> 8
        (5, 8),  # step 4 decodes 4; then 4 + 8 = 12 -> 16
        (6, 17),  # 5 + 17 = 22 -> 32
        (7, 150),  # 6 + 58 = 64, 6 + 58 = 64 (a later chunk), 6 + 34 = 40 -> 64
        (10, 2),  # 7 + 2 + 3 = 12 -> 16, two new prompts beside seven decodes
        (10, 3),
        (11, 30),  # 9 + 30 = 39 -> 64
        (12, 1),  # 10 + 1 = 11 -> 16: a 1-token prompt among decodes
        (13, 21),  # 11 + 21 = 32
    ]
    return [
        Arrival(
            step,
            tuple(rng.randrange(256) for _ in range(length)),
            params(kind_of(i), i, max_tokens=20 + 3 * (i % 5)),
        )
        for i, (step, length) in enumerate(plan)
    ]


def run_workload(llm, workload: list[Arrival]) -> list[list[int]]:
    """Drive the engine step by step, adding each request at its step; tokens in order."""
    engine = llm.engine
    pending = sorted(workload, key=lambda a: a.step)
    seqs = []
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].step <= step:
            arrival = pending.pop(0)
            seqs.append(engine.add_request(list(arrival.prompt), arrival.params))
        engine.step()
        step += 1
        assert step < 1000, "the engine does not drain"
    assert all(s.finish_reason.value == "length" for s in seqs)
    return [list(s.output_token_ids) for s in seqs]


def ladder_engine(mode: str | None, **options):
    options = {"max_num_seqs": 16, "max_num_batched_tokens": 64, **options}
    options.setdefault("max_model_len", MAX_MODEL_LEN)
    if mode is None:
        return make_llm("cpu", enforce_eager=True, **options)
    return make_llm("cpu", cudagraph_mode=mode, cudagraph_capture_sizes=LADDER, **options)


def assert_every_rung_ran_as_a_mixed_step(llm, mode: str) -> None:
    steps = llm.stats.steps
    for size in LADDER:
        at_size = [s for s in steps if not s.uniform_decode and s.num_padded_tokens == size]
        assert all(s.runtime_mode == "PIECEWISE" for s in at_size), size
        assert at_size, f"no mixed step ran on the {size}-token graph"
        if size > 1:  # one token cannot be a prefill and a decode at once
            assert any(s.num_prefill_tokens and s.num_decode_tokens for s in at_size), size
    padded = {s.num_padded_tokens for s in mixed_records(llm) if s.num_tokens < s.num_padded_tokens}
    assert padded >= {4, 8, 16, 32, 64}, f"mixed steps with padded rows only at {padded}"
    for s in steps:
        assert s.num_tokens <= s.num_padded_tokens <= 64
        if not s.uniform_decode:
            assert s.runtime_mode == "PIECEWISE"
        else:
            assert s.runtime_mode == ("FULL" if mode == "full_and_piecewise" else "PIECEWISE")
    decode_sizes = {s.num_reqs for s in steps if s.uniform_decode}
    assert len(decode_sizes) >= 8, decode_sizes


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise"])
def test_graph_modes_equal_eager_at_every_ladder_size(mode):
    # Half the requests sample with a seed of their own: the padded rows must not move
    # anyone's draws either.
    workload = ladder_workload(kind_of=lambda i: "seeded" if i % 2 else "greedy")
    eager = ladder_engine(None)
    expected = run_workload(eager, workload)
    assert set(eager.stats.steps_per_runtime_mode) == {"NONE"}
    graphs = ladder_engine(mode)
    assert graphs.engine.runner.capture_sizes == LADDER
    assert run_workload(graphs, workload) == expected
    assert_every_rung_ran_as_a_mixed_step(graphs, mode)
    # Eager and graph engines planned the same steps (only the padding differs).
    assert [(s.num_reqs, s.num_tokens) for s in graphs.stats.steps] == [
        (s.num_reqs, s.num_tokens) for s in eager.stats.steps
    ]
    # ... and the mixed steps are also what a request alone gets.
    greedy = [a for a in workload if a.params.greedy]
    solo = solo_tokens([list(a.prompt) for a in greedy], [a.params for a in greedy])
    assert [t for t, a in zip(expected, workload) if a.params.greedy] == solo


def staggered_workload(n: int = 64, seed: int = 0) -> list[Arrival]:
    """`n` prompts of 100-220 tokens arriving 0 to 3 a step, each asking 8-32 tokens: with
    a budget of 1024 tokens most steps are mixed, of 100 to 600 tokens."""
    rng = random.Random(seed)
    workload, step = [], 0
    while len(workload) < n:
        for _ in range(min(rng.choice([0, 0, 1, 1, 2, 3]), n - len(workload))):
            prompt = tuple(rng.randrange(256) for _ in range(rng.randint(100, 220)))
            workload.append(
                Arrival(step, prompt, params("greedy", len(workload), rng.randint(8, 32)))
            )
        step += 1
    return workload


# The default ladder of 256 requests and 1024 tokens a step: 1, 2, 4, 8 .. 248, 256 .. 512.
BIG_LADDER_ENGINE = dict(
    max_num_seqs=256,
    max_num_batched_tokens=1024,
    max_model_len=MAX_MODEL_LEN,
    block_size=16,
    num_kv_blocks=1100,
)


def assert_mixed_steps_ran_piecewise_up_to_512(llm) -> None:
    sizes = llm.engine.runner.capture_sizes
    assert sizes[-1] == 512
    mixed = [s for s in llm.stats.steps if not s.uniform_decode]
    for s in mixed:
        if s.num_tokens <= 512:
            assert s.runtime_mode == "PIECEWISE", s
            assert s.num_padded_tokens == padded_size(s.num_tokens, sizes), s
        else:
            assert (s.runtime_mode, s.num_padded_tokens) == ("NONE", s.num_tokens), s
    rungs = {s.num_padded_tokens for s in mixed if s.runtime_mode == "PIECEWISE"}
    assert len(rungs) >= 12 and len({r for r in rungs if r > 256}) >= 4, sorted(rungs)
    assert all(s.runtime_mode == "FULL" for s in llm.stats.steps if s.uniform_decode)


def test_graphs_equal_eager_at_ladder_sizes_up_to_512():
    workload = staggered_workload()
    expected = run_workload(make_llm("cpu", enforce_eager=True, **BIG_LADDER_ENGINE), workload)
    graphs = make_llm("cpu", cudagraph_mode="full_and_piecewise", **BIG_LADDER_ENGINE)
    assert run_workload(graphs, workload) == expected
    assert_mixed_steps_ran_piecewise_up_to_512(graphs)


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise"])
@pytest.mark.parametrize("scenario", ["prefix-caching+preemption", "short-and-long-together"])
def test_graph_modes_equal_eager_under_preemption_and_prefix_caching(mode, scenario):
    make_prompts, options = SCENARIOS[scenario]
    prompts = make_prompts()
    sampling = [params("greedy", i) for i in range(len(prompts))]
    expected = ladder_engine(None, **options).generate(prompts, sampling, use_tqdm=False)
    graphs = ladder_engine(mode, **options)
    outputs = graphs.generate(prompts, sampling, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    largest = graphs.engine.runner.capture_sizes[-1]  # the ladder, cut at the token budget
    mixed = [s for s in mixed_records(graphs) if s.num_tokens <= largest]
    assert mixed and all(s.runtime_mode == "PIECEWISE" for s in mixed)
    assert any(s.num_tokens < s.num_padded_tokens for s in mixed)
    if "preemption" in scenario:
        assert graphs.stats.num_preemptions > 0


# -- 3. a mixed step's attention against a dense float64 reference ------------------------


def paged_metadata(
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_lens: list[int],
    uniform_decode: bool,
) -> PagedAttentionMetadata:
    """The one place that knows the metadata constructor (it is gaining fields)."""
    return PagedAttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.long, device=block_tables.device),
        query_lens=list(query_lens),
        seq_lens_host=list(seq_lens),
        uniform_decode=uniform_decode,
    )


@dataclass
class MixedStep:
    """One step's inputs at the backend, and the truth to check its output against."""

    q: torch.Tensor  # [rows, H, D]: the requests' new tokens end to end, then padded rows
    k: torch.Tensor  # [rows, Hkv, D]
    v: torch.Tensor
    kv_cache: torch.Tensor  # the cache as it was before the step
    metadata: PagedAttentionMetadata
    layout: list[tuple[int, int]]  # per request: (tokens already cached, new tokens)
    keys: list[torch.Tensor]  # per request: all its keys [seq_len, Hkv, D], float64
    values: list[torch.Tensor]
    expected_cache: torch.Tensor  # the cache after the step's writes (scratch block aside)
    num_blocks: int  # real blocks (the scratch block follows)


def build_mixed_step(
    layout,
    heads=4,
    kv_heads=2,
    dim=16,
    block_size=4,
    pad_rows=0,
    uniform_decode=False,
    seed=0,
    dtype=torch.float32,
    device="cpu",
) -> MixedStep:
    """Requests `layout` = [(cached, new), ...] in that row order, each with blocks drawn
    at random from a shared pool, every slot around them (the rest of their last block,
    other requests' blocks, unused blocks, the block-table columns past a request's
    blocks) full of random garbage; `pad_rows` padded rows at the end, as a padded
    piecewise step has them (slot -1; under uniform decode, rows of their own too)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    seq_lens = [cached + new for cached, new in layout]
    blocks_per_req = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # a few blocks nobody holds
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables, start = [], 0
    for count in blocks_per_req:
        tables.append(pool[start : start + count])
        start += count
    width = max(blocks_per_req) + 1
    # Columns past a request's blocks hold stale ids, as the runner's persistent table does.
    table_rows = [t + [rng.randrange(num_blocks) for _ in range(width - len(t))] for t in tables]

    kv_cache = allocate_paged_kv_caches(1, num_blocks, block_size, kv_heads, dim, dtype, device)[0]
    kv_cache.copy_(randn(*kv_cache.shape, scale=3.0).to(dtype))
    keys, values, queries, slots = [], [], [], []
    for (cached, new), table in zip(layout, tables):
        # Round to the cache's dtype first: the reference sees what the backend sees.
        key = randn(cached + new, kv_heads, dim).to(dtype).double()
        value = randn(cached + new, kv_heads, dim).to(dtype).double()
        positions = torch.arange(cached + new, device=device)
        block_ids = torch.tensor(table, device=device)[positions // block_size]
        offsets = positions % block_size
        kv_cache[0, block_ids[:cached], offsets[:cached]] = key[:cached].to(device, dtype)
        kv_cache[1, block_ids[:cached], offsets[:cached]] = value[:cached].to(device, dtype)
        keys.append(key)
        values.append(value)
        queries.append(randn(new, heads, dim).to(dtype).double())
        slots += (block_ids[cached:] * block_size + offsets[cached:]).tolist()
    expected_cache = kv_cache.clone()
    for (cached, new), table, key, value in zip(layout, tables, keys, values):
        positions = torch.arange(cached, cached + new, device=device)
        block_ids = torch.tensor(table, device=device)[positions // block_size]
        expected_cache[0, block_ids, positions % block_size] = key[cached:].to(device, dtype)
        expected_cache[1, block_ids, positions % block_size] = value[cached:].to(device, dtype)

    query_lens = [new for _, new in layout]
    if uniform_decode:
        assert all(new == 1 for new in query_lens)
        # pad_inputs: each padded token is a request of its own, with length 0.
        query_lens += [1] * pad_rows
        seq_lens = seq_lens + [0] * pad_rows
        table_rows += [[rng.randrange(num_blocks) for _ in range(width)] for _ in range(pad_rows)]
    slots += [-1] * pad_rows

    def rows(per_request, num_heads):
        # Padded rows carry large garbage: any of it in a real row shows.
        padding = randn(pad_rows, num_heads, dim, scale=100.0)
        return torch.cat([*per_request, padding]).to(device, dtype)

    metadata = paged_metadata(
        torch.tensor(slots, dtype=torch.long, device=device),
        torch.tensor(table_rows, dtype=torch.long, device=device),
        seq_lens,
        query_lens,
        uniform_decode,
    )
    return MixedStep(
        q=rows(queries, heads),
        k=rows([key[cached:] for key, (cached, _) in zip(keys, layout)], kv_heads),
        v=rows([value[cached:] for value, (cached, _) in zip(values, layout)], kv_heads),
        kv_cache=kv_cache,
        metadata=metadata,
        layout=list(layout),
        keys=keys,
        values=values,
        expected_cache=expected_cache,
        num_blocks=num_blocks,
    )


def dense_reference(query, keys, values, cached: int) -> torch.Tensor:
    """Causal softmax attention in float64 for one request: query token j sits at
    position cached + j and sees keys 0 .. cached + j; query head h reads KV head
    h // (H / Hkv)."""
    new, num_heads, dim = query.shape
    group = num_heads // keys.shape[1]
    visible = torch.arange(keys.shape[0])[None, :] <= (cached + torch.arange(new))[:, None]
    out = torch.empty(new, num_heads, dim, dtype=torch.float64)
    for h in range(num_heads):
        scores = query[:, h] @ keys[:, h // group].T / math.sqrt(dim)
        scores = scores.masked_fill(~visible, float("-inf"))
        out[:, h] = scores.softmax(dim=-1) @ values[:, h // group]
    return out


def check_mixed_step(backend, step: MixedStep, tol: float) -> None:
    """Run the step through `backend.forward` and hold every real row, the cache writes
    and the padded rows to the truth."""
    kv_cache = step.kv_cache.clone()
    out = backend.forward(step.q, step.k, step.v, kv_cache, step.metadata)
    assert out.shape == step.q.shape and out.dtype == step.q.dtype
    row = 0
    for i, (cached, new) in enumerate(step.layout):
        query = step.q[row : row + new].double().cpu()
        expected = dense_reference(query, step.keys[i], step.values[i], cached)
        torch.testing.assert_close(
            out[row : row + new].double().cpu(),
            expected,
            rtol=tol,
            atol=tol,
            msg=lambda m, i=i, c=cached, n=new: f"request {i} (cached {c}, new {n}): {m}",
        )
        row += new
    assert torch.isfinite(out).all(), "padded rows came back with inf or nan"
    # The new K/V went to their slots and nowhere else (the scratch block takes padding).
    n = step.num_blocks
    assert torch.equal(kv_cache[:, :n], step.expected_cache[:, :n]), "wrong KV-cache writes"


# Prefill chunks of 1, 2, 17, 64 and 100 tokens, first ones (nothing cached) and later
# ones (a request's earlier tokens cached), in between decodes, in the order a step may
# hold them: running requests (decodes and continuing chunks) first, then new prompts.
MIXED_LAYOUT = [
    (33, 1),  # a decode
    (40, 64),  # a later chunk
    (7, 1),  # a decode
    (5, 2),  # a later chunk of 2
    (64, 17),  # a later chunk of 17
    (12, 100),  # a later chunk of 100
    (1, 1),  # a decode right after a 1-token prompt
    (0, 17),  # a new prompt
    (0, 1),  # a 1-token prompt
    (0, 100),  # a new prompt, the longest chunk
    (0, 2),
    (99, 1),  # a decode at a long context
]
HEAD_LAYOUTS = [(4, 2), (8, 2), (4, 4), (6, 3)]  # (query heads, KV heads)


@pytest.mark.parametrize("pad_rows", [0, 7])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads, kv_heads", HEAD_LAYOUTS)
def test_mixed_step_attention_matches_dense_reference(heads, kv_heads, block_size, pad_rows):
    step = build_mixed_step(
        MIXED_LAYOUT, heads, kv_heads, dim=16, block_size=block_size, pad_rows=pad_rows, seed=1
    )
    check_mixed_step(PagedAttentionBackend(), step, tol=1e-5)


@pytest.mark.parametrize("pad_rows", [0, 3])
def test_uniform_decode_step_matches_dense_reference(pad_rows):
    layout = [(33, 1), (0, 1), (7, 1), (99, 1), (16, 1)]
    step = build_mixed_step(layout, 8, 2, pad_rows=pad_rows, uniform_decode=True, seed=2)
    check_mixed_step(PagedAttentionBackend(), step, tol=1e-5)


layouts = st.lists(
    st.tuples(
        st.integers(0, 70),  # tokens already cached
        st.one_of(st.just(1), st.integers(2, 100), st.sampled_from([2, 17, 64, 100])),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=layouts,
    head_layout=st.sampled_from(HEAD_LAYOUTS),
    block_size=st.sampled_from([1, 4, 16]),
    pad_rows=st.integers(0, 9),
    uniform=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_mixed_steps_match_dense_reference(
    layout, head_layout, block_size, pad_rows, uniform, seed
):
    uniform = uniform and all(new == 1 for _, new in layout)
    step = build_mixed_step(
        layout,
        *head_layout,
        dim=8,
        block_size=block_size,
        pad_rows=pad_rows,
        uniform_decode=uniform,
        seed=seed,
    )
    check_mixed_step(PagedAttentionBackend(), step, tol=1e-5)
