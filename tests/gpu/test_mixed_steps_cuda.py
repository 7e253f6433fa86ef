"""Mixed prefill+decode steps on CUDA (GPU-REQ; the CPU side, and the workloads and
helpers used here: tests/engine/test_mixed_steps.py).

- The attention of one mixed step (prefill chunks of 1 to 100 tokens, first and later
  ones, beside decodes, with padded rows) on the backend the model runner selects on
  CUDA (`custom_ops="all"`: the Triton kernels) and on the plain torch one
  (`custom_ops="none"`), against a dense float64 causal softmax per request.
- The engine: float32 CUDA with CUDA graphs gives exactly the tokens of float32 CPU
  eager (batched mixed steps, long prompts in chunks, preemption, prefix caching, every
  rung of a small ladder); bf16 with the default FULL_AND_PIECEWISE gives the tokens of
  the same bf16 engine with enforce_eager (the same steps, without padding), within the
  bf16 rule below: on a ladder of 7 rungs, under chunks, preemption and prefix caching,
  and on the default ladder up to 512 tokens.

Tolerances:
- attention, bf16: 2e-2. The inputs are rounded to bf16 before the float64 reference
  sees them, so only the kernel's arithmetic counts: bf16 output (8 significant bits)
  and probabilities rounded to bf16 for the tensor cores (tests/gpu/test_paged_attention_cuda.py).
- attention, float32: 1e-4 (the kernels' dot products are IEEE float32, summed in
  another order than the reference's).
- tokens, float32: exact, with TF32 off (what greedy decoding on the tiny model's wide
  logits tolerates: a wrong KV read or a leaked padded row changes tokens, rounding
  does not).
- tokens, bf16: a graph pads its batch to a captured size, which changes the shape of
  every matrix product and so its rounding; in bf16 a near-tie of two logits may flip a
  greedy token, and the rest of that request follows another path. So every request
  must agree on its first `BF16_FIRST_TOKENS` tokens, and all but one request in 20 (at
  least two) on all of them. A real bug (a wrong mask, block table or row) changes most
  requests from their first tokens on. Seen on an H100: 11 of 12 requests identical on
  the 7-rung ladder workload, every request identical in the other runs (64 of 64 up to
  512 tokens).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from mini_vllm import LLM, SamplingParams
from mini_vllm._custom_ops import parse_custom_ops
from mini_vllm.attention.paged import PagedAttentionBackend
from mini_vllm.attention.selector import get_attn_backend
from mini_vllm.config.compilation import CUDAGraphMode
from tests.engine.test_cudagraph_runner import make_llm
from tests.engine.test_mixed_steps import (
    BIG_LADDER_ENGINE,
    HEAD_LAYOUTS,
    LADDER,
    MAX_MODEL_LEN,
    MIXED_LAYOUT,
    SCENARIOS,
    assert_every_rung_ran_as_a_mixed_step,
    assert_mixed_steps_ran_piecewise_up_to_512,
    build_mixed_step,
    check_mixed_step,
    ladder_workload,
    layouts,
    mixed_records,
    params,
    run_workload,
    solo_tokens,
    staggered_workload,
)

pytestmark = pytest.mark.gpu

BF16_FIRST_TOKENS = 3
# The ladder workload's engine (tests/engine/test_mixed_steps.py: ladder_engine), with a
# KV cache of its own size: on CUDA an unset cache takes what the GPU's memory leaves.
LADDER_ENGINE = dict(
    max_num_seqs=16,
    max_num_batched_tokens=64,
    max_model_len=MAX_MODEL_LEN,
    block_size=4,
    num_kv_blocks=1024,
)


@pytest.fixture
def exact_fp32_matmul():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def bf16_llm(**options) -> LLM:
    return LLM("tiny", device="cuda", dtype="bfloat16", **options)


def assert_bf16_tokens_agree(got: list[list[int]], expected: list[list[int]]) -> None:
    """The bf16 rule of the module docstring."""
    assert len(got) == len(expected)
    same = sum(a == b for a, b in zip(got, expected))
    print(f"bf16: {same} of {len(got)} requests identical")  # shown with -s
    early = [
        i
        for i, (a, b) in enumerate(zip(got, expected))
        if a[:BF16_FIRST_TOKENS] != b[:BF16_FIRST_TOKENS]
    ]
    differ = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert not early, f"requests {early} differ in their first {BF16_FIRST_TOKENS} tokens"
    allowed = max(2, len(got) // 20)
    assert len(differ) <= allowed, f"{len(differ)} of {len(got)} requests differ: {differ}"


# -- the attention of one mixed step --------------------------------------------------------

BACKENDS = ["all", "none"]  # custom_ops: the runner's CUDA choice, and plain torch
TOLERANCES = [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)]


def cuda_backend(custom_ops: str):
    backend = get_attn_backend(torch.device("cuda"), parse_custom_ops(custom_ops))
    if custom_ops == "none":
        assert type(backend) is PagedAttentionBackend
    else:  # the kernels, or this test would check the torch path twice
        assert type(backend) is not PagedAttentionBackend, "no CUDA attention kernels selected"
    return backend


@pytest.mark.parametrize("pad_rows", [0, 7])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads, kv_heads", HEAD_LAYOUTS + [(32, 8)])
@pytest.mark.parametrize("dtype, tol", TOLERANCES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("custom_ops", BACKENDS)
def test_cuda_mixed_step_attention_matches_dense_reference(
    custom_ops, dtype, tol, heads, kv_heads, block_size, pad_rows
):
    step = build_mixed_step(
        MIXED_LAYOUT,
        heads,
        kv_heads,
        dim=64,
        block_size=block_size,
        pad_rows=pad_rows,
        seed=1,
        dtype=dtype,
        device="cuda",
    )
    check_mixed_step(cuda_backend(custom_ops), step, tol=tol)


@pytest.mark.parametrize("custom_ops", BACKENDS)
def test_cuda_uniform_decode_step_matches_dense_reference(custom_ops):
    layout = [(33, 1), (0, 1), (7, 1), (99, 1), (16, 1)]
    step = build_mixed_step(
        layout,
        8,
        2,
        dim=64,
        pad_rows=3,
        uniform_decode=True,
        seed=2,
        dtype=torch.bfloat16,
        device="cuda",
    )
    check_mixed_step(cuda_backend(custom_ops), step, tol=2e-2)


@pytest.mark.parametrize("custom_ops", BACKENDS)
def test_cuda_random_mixed_steps_match_dense_reference(custom_ops):
    backend = cuda_backend(custom_ops)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(layout=layouts)
    def check(layout):
        for (heads, kv_heads), block_size, pad_rows in [
            (HEAD_LAYOUTS[len(layout) % len(HEAD_LAYOUTS)], 16, len(layout) % 5),
            ((8, 2), 4, 0),
        ]:
            step = build_mixed_step(
                layout,
                heads,
                kv_heads,
                dim=64,
                block_size=block_size,
                pad_rows=pad_rows,
                seed=len(layout),
                dtype=torch.bfloat16,
                device="cuda",
            )
            check_mixed_step(backend, step, tol=2e-2)

    check()


# -- the engine: float32 CUDA equals float32 CPU, exactly -----------------------------------


def test_cuda_float32_graphs_equal_cpu_eager_at_every_ladder_size(exact_fp32_matmul):
    workload = ladder_workload()
    cpu = make_llm("cpu", enforce_eager=True, **LADDER_ENGINE)
    expected = run_workload(cpu, workload)
    cuda = make_llm("cuda", cudagraph_capture_sizes=LADDER, **LADDER_ENGINE)
    assert cuda.engine.runner.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE  # the default
    assert run_workload(cuda, workload) == expected
    assert_every_rung_ran_as_a_mixed_step(cuda, "full_and_piecewise")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cuda_float32_batched_mixed_steps_equal_each_request_alone(scenario, exact_fp32_matmul):
    make_prompts, options = SCENARIOS[scenario]
    prompts = make_prompts()
    greedy = [params("greedy", i) for i in range(len(prompts))]
    options = {"num_kv_blocks": 1024, **options}
    llm = make_llm("cuda", max_model_len=MAX_MODEL_LEN, cudagraph_capture_sizes=LADDER, **options)
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    # Greedy: what float32 CPU gives each prompt alone.
    assert [o.token_ids for o in outputs] == solo_tokens(prompts, greedy)
    largest = llm.engine.runner.capture_sizes[-1]  # LADDER, cut at the token budget
    mixed = [s for s in mixed_records(llm) if s.num_tokens <= largest]
    assert mixed and all(s.runtime_mode == "PIECEWISE" for s in mixed)
    if "preemption" in scenario:
        assert llm.stats.num_preemptions > 0
    # Seeded sampling draws from CUDA generators: compare with CUDA alone.
    seeded = [params("seeded", i) for i in range(len(prompts))]
    batched = llm.generate(prompts, seeded, use_tqdm=False)
    alone = make_llm("cuda", max_num_seqs=1, max_model_len=MAX_MODEL_LEN, num_kv_blocks=64)
    expected = [
        alone.generate([p], s, use_tqdm=False)[0].token_ids for p, s in zip(prompts, seeded)
    ]
    assert [o.token_ids for o in batched] == expected


# -- the engine: bf16 FULL_AND_PIECEWISE equals bf16 eager, within the bf16 rule -------------


def test_bf16_default_graphs_equal_eager_at_every_ladder_size():
    workload = ladder_workload(kind_of=lambda i: "seeded" if i % 2 else "greedy")
    expected = run_workload(bf16_llm(enforce_eager=True, **LADDER_ENGINE), workload)
    graphs = bf16_llm(cudagraph_capture_sizes=LADDER, **LADDER_ENGINE)
    assert graphs.engine.runner.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE
    assert_bf16_tokens_agree(run_workload(graphs, workload), expected)
    assert_every_rung_ran_as_a_mixed_step(graphs, "full_and_piecewise")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bf16_default_graphs_equal_eager_under_chunks_preemption_and_prefix_caching(scenario):
    # The same engine eager and with graphs: the same steps, only the padding differs.
    # (Against each request alone, bf16 also differs by the chunking of the prefill, which
    # moves near-ties of long prompts: float32 checks that above.)
    make_prompts, options = SCENARIOS[scenario]
    prompts = make_prompts()
    greedy = [params("greedy", i) for i in range(len(prompts))]
    options = dict(max_model_len=MAX_MODEL_LEN, block_size=4, **{"num_kv_blocks": 1024, **options})
    eager = bf16_llm(enforce_eager=True, **options)
    expected = [o.token_ids for o in eager.generate(prompts, greedy, use_tqdm=False)]
    llm = bf16_llm(cudagraph_capture_sizes=LADDER, **options)
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    assert_bf16_tokens_agree([o.token_ids for o in outputs], expected)
    largest = llm.engine.runner.capture_sizes[-1]
    mixed = [s for s in mixed_records(llm) if s.num_tokens <= largest]
    assert mixed and all(s.runtime_mode == "PIECEWISE" for s in mixed)
    if "preemption" in scenario:
        assert llm.stats.num_preemptions > 0


def test_bf16_default_graphs_equal_eager_at_ladder_sizes_up_to_512():
    # 64 requests arriving a few at a time: mixed steps of 100 to 600 tokens, padded to
    # the rungs of the default ladder (every 16 tokens from 256 to 512).
    workload = staggered_workload()
    expected = run_workload(bf16_llm(enforce_eager=True, **BIG_LADDER_ENGINE), workload)
    graphs = bf16_llm(**BIG_LADDER_ENGINE)
    assert graphs.engine.runner.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE
    assert_bf16_tokens_agree(run_workload(graphs, workload), expected)
    assert_mixed_steps_ran_piecewise_up_to_512(graphs)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_async_step_launch_never_waits_for_the_gpu(temperature):
    """Under async scheduling the host plans and launches step N+1 while the GPU runs
    step N; one synchronising call in the launch (a pageable host-to-device copy, an
    `.item()`) would make it wait for step N and undo the overlap. PyTorch's sync debug
    mode turns any such call into an error; the launch of mixed and decode steps, with
    sampling options that build device tensors (top-p, penalties, logit bias) and with
    log-probabilities, must pass.
    """
    llm = LLM(
        "tiny",
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=8,
        max_model_len=128,
        async_scheduling=True,
    )
    engine = llm.engine
    runner = engine.runner
    options = dict(temperature=temperature, max_tokens=12, ignore_eos=True)
    for i in range(6):
        extra = {"top_p": 0.9, "presence_penalty": 0.5, "logit_bias": {3: 1.0}} if i % 2 else {}
        if i % 3 == 0:
            extra["logprobs"] = 2  # their values travel to the host with the sampled ids
        prompt = [3 + (5 * i + j) % 200 for j in range(10 + 7 * i)]
        engine.add_request(prompt, SamplingParams(**options, **extra))
    launch = runner.execute_model
    launched = 0

    def launch_without_sync(output, non_blocking=False):
        nonlocal launched
        assert non_blocking, "the async engine launches its steps non-blocking"
        torch.cuda.set_sync_debug_mode("error")
        try:
            handle = launch(output, non_blocking=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        launched += 1
        return handle

    runner.execute_model = launch_without_sync
    while engine.has_unfinished_requests():
        engine.step()
    assert launched >= 12
