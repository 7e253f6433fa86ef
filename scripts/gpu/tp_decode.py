#!/usr/bin/env python3
"""Tensor parallelism on two GPUs: the same tokens as one GPU in every graph mode, the failure
paths on NCCL, and the decode step at TP=1 and TP=2 side by side on one host.

    python3 scripts/gpu/tp_decode.py [--models llama-3.2-1b-like,llama-3.1-8b-like]
        [--batches 1,32] [--modes eager,graphs] [--out DIR] [--skip-checks]

1. Correctness: `tiny` in float32, greedy, with log-probabilities: TP=2 (one process a GPU,
   NCCL) eager, with FULL_AND_PIECEWISE graphs (the default on a GPU), and compiled with
   graphs, each against TP=1 eager: tokens equal and the largest log-probability difference;
   then the default mode under `torchrun --nproc-per-node 2` (`external_launcher`).
2. Failure paths with graphs: a worker killed in the middle of a generation, and a worker
   that stops answering (SIGSTOP); how long until rank 0 raises, what it says, and whether
   the process then exits.
3. Timing: for each model, TP size and mode, a fresh process builds the engine (bfloat16,
   random weights), and for each batch decodes 64 tokens for every request; the step time
   is the median wall time between consecutive `LLMEngine.step` returns over the steps where
   every request decodes. Modes: `eager` (enforce_eager), `graphs` (the GPU default:
   FULL_AND_PIECEWISE graphs), `compiled` (VLLM_COMPILE and the same graphs).

Writes DIR/tp-decode.md (default out/gpu). Needs two NVIDIA GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "eager": {"enforce_eager": True},
    "graphs-only": {"cudagraph_mode": "full_and_piecewise", "compilation_mode": "none"},
    "graphs": {},  # the default on a GPU: FULL_AND_PIECEWISE graphs, no compilation
    "compiled": {"compilation_mode": "vllm_compile"},  # and the graphs of the default
}

CORRECTNESS = """
import json, sys
from mini_vllm import LLM, SamplingParams
modes = json.loads(sys.argv[1])
params = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(20, 60)), [100] * 17]
out = {}
for name, tp, options in [("tp1-eager", 1, modes["eager"])] + [
        (f"tp2-{m}", 2, o) for m, o in modes.items()]:
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=tp,
              **options)
    done = llm.generate(prompts, params, use_tqdm=False)
    out[name] = {
        "runs": [[o.token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.token_ids)]]
                 for o in done],
        "modes": dict(llm.engine.stats.steps_per_runtime_mode),
    }
    del llm
print(json.dumps(out))
"""

LAUNCHED = """
import json, os, sys, traceback
from mini_vllm import LLM, SamplingParams
try:
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=2,
              distributed_executor_backend="external_launcher")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    result = [o.token_ids for o in llm.generate([[1, 2, 3, 4, 5], [7, 8, 9]], params,
                                                use_tqdm=False)]
except Exception:
    result = {"error": traceback.format_exc()[-2500:]}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(result, f)
"""

FAILURE = """
import json, os, signal, sys, threading, time
from mini_vllm import LLM, SamplingParams
how = sys.argv[1]
os.environ["MINI_VLLM_TP_TIMEOUT_S"] = "10"
llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=2,
          cudagraph_mode="full_and_piecewise", compilation_mode="none")
pid = llm.engine.model_executor.workers[0].process.pid
params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
hit = {}
def strike():
    time.sleep(1.0)
    hit["at"] = time.monotonic()
    os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
threading.Thread(target=strike, daemon=True).start()
try:
    llm.generate([[1, 2, 3]] * 4, params, use_tqdm=False)
    result = {"raised": False}
except RuntimeError as exc:
    result = {"raised": True, "seconds": time.monotonic() - hit["at"], "message": str(exc)[:600]}
if how == "stop":
    os.kill(pid, signal.SIGKILL)
print(json.dumps(result), flush=True)
"""

TIMING = """
import json, statistics, sys, time
from mini_vllm import LLM, SamplingParams
model, tp = sys.argv[1], int(sys.argv[2])
batches, options = json.loads(sys.argv[3]), json.loads(sys.argv[4])
llm = LLM(model, device="cuda", dtype="bfloat16", max_num_seqs=max(batches), max_model_len=512,
          tensor_parallel_size=tp, **options)
engine = llm.engine
params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
result = {}
for batch in batches:
    prompts = [[3 + (7 * i + j) % 200 for j in range(32)] for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    for p in prompts:
        engine.add_request(p, params)
    times, start = [], time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        now = time.perf_counter()
        record = engine.runner.last_step
        if record.uniform_decode and record.num_reqs == batch:
            times.append(now - start)
        start = now
    result[batch] = {"median_ms": 1000 * statistics.median(times), "steps": len(times),
                     "mode": engine.runner.last_step.runtime_mode}
print(json.dumps(result))
"""


def run(code: str, *args: str, timeout: float = 400) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def checks(lines: list[str], modes: dict) -> None:
    result = json.loads(run(CORRECTNESS, json.dumps(modes)))
    reference = result.pop("tp1-eager")["runs"]
    for name, got in result.items():
        same = all(a[0] == b[0] for a, b in zip(reference, got["runs"]))
        worst = max(abs(x - y) for a, b in zip(reference, got["runs"]) for x, y in zip(a[1], b[1]))
        lines.append(
            f"- correctness, {name} against tp1-eager (tiny, float32, NCCL): tokens equal: "
            f"{same}; largest log-probability difference {worst:.2e}; steps by mode "
            f"{got['modes']}"
        )
        print(lines[-1], flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(LAUNCHED)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(script), tmp]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in (0, 1)
                 if (Path(tmp) / f"rank{r}.json").exists()]  # fmt: skip
        expected = [t[0] for t in reference[:2]]
        ok = done.returncode == 0 and len(ranks) == 2 and all(r == expected for r in ranks)
        why = next((r["error"] for r in ranks if isinstance(r, dict)), done.stderr[-2500:])
        lines.append(
            "- torchrun --nproc-per-node 2 (external_launcher, the GPU default: "
            f"FULL_AND_PIECEWISE graphs): both ranks give the one-GPU tokens: {ok}"
            + ("" if ok else f"\n\n```text\n{why}\n```\n")
        )
        print(lines[-1], flush=True)

    for how, what in (("kill", "a worker killed (SIGKILL)"), ("stop", "a worker frozen (SIGSTOP)")):
        start = time.monotonic()
        try:
            result = json.loads(run(FAILURE, how, timeout=180))
            exited = time.monotonic() - start
            if result["raised"]:
                outcome = (
                    f"rank 0 raised after {result['seconds']:.2f} s; the process exited "
                    f"{exited:.0f} s after it started. Message: `{result['message'][:300]}`"
                )
            else:
                outcome = "generate returned without an error"
        except subprocess.TimeoutExpired:
            outcome = "HANG: no answer within 180 s"
        except RuntimeError as exc:
            outcome = f"the process failed: {str(exc)[-600:]}"
        lines.append(f"- graphs, {what} mid-generation: {outcome}")
        print(lines[-1], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-3.2-1b-like,llama-3.1-8b-like")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--modes", default="eager,graphs,compiled")
    parser.add_argument("--out", default="out/gpu")
    parser.add_argument("--skip-checks", action="store_true")
    args = parser.parse_args()
    import torch

    if torch.cuda.device_count() < 2:
        print(
            "error: scripts/gpu/tp_decode.py needs an NVIDIA GPU with CUDA, two of them",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Tensor parallelism on {torch.cuda.get_device_name(0)} x2",
        "",
        f"torch {torch.__version__}; `python3 scripts/gpu/tp_decode.py {' '.join(sys.argv[1:])}`",
        "",
    ]
    if not args.skip_checks:
        checks(lines, MODES)
    batches = [int(b) for b in args.batches.split(",") if b]
    lines += [
        "",
        "| model | mode | batch | TP=1 step ms | TP=2 step ms | TP=1 / TP=2 | TP=2 runtime mode |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            try:
                t = {
                    tp: json.loads(
                        run(TIMING, model, str(tp), json.dumps(batches), json.dumps(MODES[mode]))
                    )
                    for tp in (1, 2)
                }
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                lines.append(f"| {model} | {mode} | - | failed: {str(exc)[-300:]!r} | | | |")
                print(lines[-1], flush=True)
                continue
            for batch in batches:
                one, two = t[1][str(batch)]["median_ms"], t[2][str(batch)]["median_ms"]
                lines.append(
                    f"| {model} | {mode} | {batch} | {one:.3f} | {two:.3f} | {one / two:.2f} "
                    f"| {t[2][str(batch)]['mode']} |"
                )
                print(lines[-1], flush=True)
            (out / "tp-decode.md").write_text("\n".join(lines) + "\n")
    (out / "tp-decode.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
