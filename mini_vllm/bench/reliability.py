"""Reliability checks: a load of many prompts, and faults injected into a running engine.

vLLM counterpart: none as one tool; vLLM's tests/v1/shutdown/ checks that an exception
in the engine core surfaces to the client as EngineDeadError (the engine is gone),
where mini_vllm takes the failed step back and goes on (mini_vllm/engine/llm_engine.py).

- `run_load`: many prompts through one engine with a KV cache small enough to force
  preemption; every output is compared with the same prompt served alone.
- `inject_fault`: make the n-th call of one part of a step raise (the forward, the
  sampler, the scheduler, the update, a block allocation, the arrival of tokens in
  flight), as a bug or a Ctrl-C would.
- `run_fault`: a fault in the middle of `LLM.generate`, then the checks that matter:
  the engine is not stuck (it serves the next call, outputs equal to solo runs), no
  KV block stays held, and no request is lost or ends twice.

tests/engine/test_faults.py (and, for the CUDA-graph modes, tests/gpu/test_faults_cuda.py)
asserts on these; `python -m mini_vllm bench reliability` runs them all and writes the
figures as a table (benchmarks/results/reliability-cpu.md).
"""

from __future__ import annotations

import contextlib
import platform
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date

import torch

from mini_vllm.engine.llm_engine import LLMEngine
from mini_vllm.engine.model_runner import SampledTokens
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams

__all__ = [
    "ENGINE_MODES",
    "FAULT_POINTS",
    "GPU_ENGINE_MODES",
    "FaultResult",
    "InjectedFault",
    "LoadResult",
    "fault_points",
    "inject_fault",
    "modes_for",
    "ReliabilityReport",
    "format_reliability_markdown",
    "load_prompts",
    "run_fault",
    "run_load",
    "run_reliability_report",
    "solo_outputs",
]


class InjectedFault(RuntimeError):
    """The exception `inject_fault` raises."""


# The engine modes, as LLM keyword arguments: those the CPU runs, and on a GPU the
# default CUDA graphs (FULL_AND_PIECEWISE) with and without async scheduling. float32
# on the GPU too, so that batched and solo runs round alike and tokens can be compared.
ENGINE_MODES: dict[str, dict[str, object]] = {
    "eager": {},
    "cpu graphs": {"cudagraph_mode": "full_and_piecewise"},
    "async": {"async_scheduling": True},
    "prefix caching": {"enable_prefix_caching": True},
    "cpu graphs + async": {"cudagraph_mode": "full_and_piecewise", "async_scheduling": True},
}
GPU_ENGINE_MODES: dict[str, dict[str, object]] = {
    "cuda graphs": {"device": "cuda", "dtype": "float32"},
    "cuda graphs + async": {"device": "cuda", "dtype": "float32", "async_scheduling": True},
}


def modes_for(device: str) -> dict[str, dict[str, object]]:
    """The engine modes checked on `device` ("cpu" or "cuda")."""
    return GPU_ENGINE_MODES if device == "cuda" else ENGINE_MODES


def _engine(model: str, mode: str) -> LLM:
    return LLM(model, **SMALL_ENGINE, **{**ENGINE_MODES, **GPU_ENGINE_MODES}[mode])


# A small cache (96 tokens) for up to 6 requests of up to 64: preemption, chunked
# prefill (32 tokens a step) and prefix-cache hits all happen under load.
SMALL_ENGINE = dict(
    max_num_seqs=6, max_model_len=64, block_size=4, num_kv_blocks=24, max_num_batched_tokens=32
)

# Where a fault goes: (object, attribute) of an engine, called once or more a step.
FAULT_POINTS: dict[str, Callable[[LLMEngine], tuple[object, str]]] = {
    "forward": lambda engine: (engine.runner.graphs, "forward"),
    "sampler": lambda engine: (engine.runner.sampler, "forward"),
    "schedule": lambda engine: (engine.scheduler, "schedule"),
    "update": lambda engine: (engine.scheduler, "update_from_output"),
    "block allocation": lambda engine: (engine.block_manager, "_take_free_block"),
    # Async scheduling only: a step's tokens are read while the next step runs.
    "token arrival": lambda engine: (SampledTokens, "get"),
}


def fault_points(mode: str) -> list[str]:
    """The points a step of `mode` reaches: a synchronous step reads its tokens inside the
    step, so only async modes have a separate token arrival."""
    kwargs = {**ENGINE_MODES, **GPU_ENGINE_MODES}[mode]
    return [p for p in FAULT_POINTS if p != "token arrival" or kwargs.get("async_scheduling")]


@contextlib.contextmanager
def inject_fault(
    engine: LLMEngine,
    point: str,
    at_call: int,
    exception: type[BaseException] = InjectedFault,
) -> Iterator[Callable[[], bool]]:
    """Make call number `at_call` (from 1) of `point` raise `exception`.

    Yields a function that says whether the fault has fired; the original is back
    when the block ends.
    """
    target, name = FAULT_POINTS[point](engine)
    had_own = name in vars(target)
    original = getattr(target, name)
    calls = 0

    def faulty(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == at_call:
            raise exception(f"fault injected into {point}, call {at_call}")
        return original(*args, **kwargs)

    setattr(target, name, faulty)
    try:
        yield lambda: calls >= at_call
    finally:
        if had_own:
            setattr(target, name, original)
        else:
            delattr(target, name)


def load_prompts(
    n: int, seed: int = 0, vocab: int = 256, longest: int = 30
) -> tuple[list[list[int]], list[SamplingParams]]:
    """`n` prompts of 1..`longest` token ids, every third sharing a 12-token prefix (prefix
    cache hits), and their sampling: greedy and seeded random in turn, 4..16 new tokens."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(12)]
    prompts, params = [], []
    for i in range(n):
        body = [rng.randrange(3, vocab) for _ in range(rng.randint(1, longest - 12))]
        prompts.append((shared + body) if i % 3 == 0 else body)
        sampling = dict(temperature=0.8, top_k=50, seed=1000 + i) if i % 2 else {"temperature": 0}
        params.append(SamplingParams(max_tokens=rng.randint(4, 16), **sampling))
    return prompts, params


def solo_outputs(
    model: str, prompts: list[list[int]], params: list[SamplingParams], device: str = "cpu"
) -> list[tuple[list[int], str]]:
    """(tokens, finish reason) of each prompt served alone by an eager engine of one request."""
    llm = LLM(
        model,
        device=device,
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=1,
        max_model_len=SMALL_ENGINE["max_model_len"],
    )
    return [
        (out.token_ids, out.finish_reason)
        for prompt, sp in zip(prompts, params)
        for out in llm.generate([prompt], sp, use_tqdm=False)
    ]


@dataclass
class LoadResult:
    mode: str
    num_prompts: int
    num_served: int  # finished normally (EOS or a length limit)
    num_equal_to_solo: int
    num_preemptions: int
    num_blocks_leaked: int  # blocks still held once every request has finished


def run_load(
    mode: str,
    prompts: list[list[int]],
    params: list[SamplingParams],
    solo: list[tuple[list[int], str]],
    model: str = "tiny",
) -> LoadResult:
    """Every prompt at once through one engine with the small cache; compared with `solo`."""
    llm = _engine(model, mode)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return LoadResult(
        mode=mode,
        num_prompts=len(prompts),
        num_served=sum(out.ok for out in outputs),
        num_equal_to_solo=sum(
            (out.token_ids, out.finish_reason) == alone for out, alone in zip(outputs, solo)
        ),
        num_preemptions=llm.stats.num_preemptions,
        num_blocks_leaked=llm.engine.block_manager.num_used_blocks,
    )


@dataclass
class FaultResult:
    mode: str
    point: str
    at_call: int
    exception: str
    fired: bool  # the fault was raised (the point was reached that many times)
    raised_to_caller: bool  # LLM.generate let the exception through
    bricked: bool  # the next call failed or gave outputs unlike solo runs
    blocks_leaked: int  # blocks held after the failed call
    requests_left: bool  # the failed call left requests in the engine
    resumed_equal_to_solo: int  # requests finished by stepping on after the fault (engine API)
    num_requests: int


def run_fault(
    mode: str,
    point: str,
    at_call: int,
    prompts: list[list[int]],
    params: list[SamplingParams],
    solo: list[tuple[list[int], str]],
    exception: type[BaseException] = InjectedFault,
    model: str = "tiny",
) -> FaultResult:
    """Inject one fault into `LLM.generate`, then check the engine; then the same fault
    through the engine API, stepping on after it to finish the very same requests."""
    llm = _engine(model, mode)
    engine = llm.engine
    raised = False
    with inject_fault(engine, point, at_call, exception) as fired:
        try:
            llm.generate(prompts, params, use_tqdm=False)
        except exception:
            raised = True
    fired_in_generate = fired()
    leaked = engine.block_manager.num_used_blocks
    left = engine.has_unfinished_requests()
    try:
        again = llm.generate(prompts, params, use_tqdm=False)
        bricked = [(out.token_ids, out.finish_reason) for out in again] != solo
    except Exception:
        bricked = True
    # The engine API: the requests stay queued after the exception and finish on the
    # next steps, with the tokens they would have had without it.
    seqs = [engine.add_request(prompt, sp) for prompt, sp in zip(prompts, params)]
    with inject_fault(engine, point, at_call, exception):
        while engine.has_unfinished_requests():
            try:
                engine.step()
            except exception:
                pass
    resumed = sum(
        (list(seq.output_token_ids), seq.finish_reason.value) == alone
        for seq, alone in zip(seqs, solo)
    )
    return FaultResult(
        mode=mode,
        point=point,
        at_call=at_call,
        exception=exception.__name__,
        fired=fired_in_generate,
        raised_to_caller=raised,
        bricked=bricked,
        blocks_leaked=leaked + engine.block_manager.num_used_blocks,
        requests_left=left,
        resumed_equal_to_solo=resumed,
        num_requests=len(prompts),
    )


@dataclass
class ReliabilityReport:
    model: str
    device: str
    loads: list[LoadResult]
    faults: list[FaultResult]
    num_fault_prompts: int


def run_reliability_report(
    model: str = "tiny",
    num_prompts: int = 200,
    at_calls: tuple[int, ...] = (1, 4, 9),
    log: Callable[[str], None] = print,
    device: str = "cpu",
) -> ReliabilityReport:
    """The load in every mode of `device`, then every fault point x call x exception."""
    modes = modes_for(device)
    prompts, params = load_prompts(num_prompts, seed=0)
    solo = solo_outputs(model, prompts, params, device)
    loads = []
    for mode in modes:
        loads.append(run_load(mode, prompts, params, solo, model))
        log(f"load, {mode}: {loads[-1]}")
    fault_prompts, fault_params = load_prompts(12, seed=1)
    fault_solo = solo_outputs(model, fault_prompts, fault_params, device)
    faults = []
    for mode in modes:
        for point in fault_points(mode):
            for at_call in at_calls:
                for exception in (InjectedFault, KeyboardInterrupt):
                    faults.append(
                        run_fault(
                            mode,
                            point,
                            at_call,
                            fault_prompts,
                            fault_params,
                            fault_solo,
                            exception,
                            model,
                        )
                    )
        log(f"faults, {mode}: {sum(f.fired for f in faults if f.mode == mode)} injected")
    return ReliabilityReport(model, device, loads, faults, len(fault_prompts))


def format_reliability_markdown(report: ReliabilityReport, command: str) -> str:
    lines = [
        "# Reliability: a load under preemption, and faults injected into steps",
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {_machine(report.device)}; torch {torch.__version__}",
        f"- command: `{command}`",
        f"- model: `{report.model}`; engine: "
        + ", ".join(f"`{name}={value}`" for name, value in SMALL_ENGINE.items()),
        "",
        f"## {report.loads[0].num_prompts} prompts at once, each compared with itself served alone",
        "",
        "Greedy and seeded sampling in turn, 4 to 16 new tokens, a third of the prompts "
        "sharing a 12-token prefix.",
        "",
        "<!-- ANCHOR: load -->",  # the book includes each table by its anchor
        "| mode | prompts | served | equal to solo | preemptions | blocks leaked |",
        "|---|---|---|---|---|---|",
    ]
    for load in report.loads:
        lines.append(
            f"| {load.mode} | {load.num_prompts} | {load.num_served} | "
            f"{load.num_equal_to_solo} | {load.num_preemptions} | {load.num_blocks_leaked} |"
        )
    lines += [
        "<!-- ANCHOR_END: load -->",
        "",
        f"## Faults: one per `LLM.generate` of {report.num_fault_prompts} prompts",
        "",
        "Each fault is raised at the n-th call of one point of a step (n in "
        f"{sorted({f.at_call for f in report.faults})}), as `InjectedFault` (a bug) and as "
        "`KeyboardInterrupt` (Ctrl-C). Bricked: the next call failed or its outputs differ "
        "from solo runs. Resumed: the same requests through the engine API, stepped on after "
        "the fault, finishing with the tokens of a solo run.",
        "",
        "<!-- ANCHOR: faults -->",
        "| mode | faults injected | reached the caller | engines bricked | blocks leaked "
        "| requests left behind | resumed equal to solo |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in modes_for(report.device):
        fired = [f for f in report.faults if f.mode == mode and f.fired]
        lines.append(_fault_row(mode, fired))
    lines.append(_fault_row("**all**", [f for f in report.faults if f.fired]))
    lines.append("<!-- ANCHOR_END: faults -->")
    points = sorted({f.point for f in report.faults})
    lines += ["", f"Points: {', '.join(points)} (token arrival: async modes only)."]
    return "\n".join(lines) + "\n"


def _machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()} (float32, so batched and solo runs round alike)"
    return f"{platform.machine()}, {torch.get_num_threads()} torch threads"


def _fault_row(label: str, faults: list[FaultResult]) -> str:
    resumed = sum(f.resumed_equal_to_solo for f in faults)
    return (
        f"| {label} | {len(faults)} | {sum(f.raised_to_caller for f in faults)} | "
        f"{sum(f.bricked for f in faults)} | {sum(f.blocks_leaked for f in faults)} | "
        f"{sum(f.requests_left for f in faults)} | "
        f"{resumed} of {sum(f.num_requests for f in faults)} |"
    )
