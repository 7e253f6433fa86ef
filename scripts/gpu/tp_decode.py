#!/usr/bin/env python3
"""Tensor parallelism on two GPUs: the same tokens as one GPU, and the decode step's time at
TP=1 and TP=2 side by side on one host (eager: graphs are refused at TP > 1 for now).

    python3 scripts/gpu/tp_decode.py [--models llama-3.2-1b-like] [--batches 1,32] [--out DIR]

1. Correctness: `tiny` in float32, greedy, with log-probabilities: TP=2 (one process a GPU,
   NCCL) against TP=1, tokens equal and log-probabilities within 1e-4; then the same under
   `torchrun --nproc-per-node 2` (`distributed_executor_backend="external_launcher"`).
2. Timing: for each model and batch, a fresh process builds the engine (bfloat16, eager,
   random weights), decodes 64 tokens for every request of the batch, and reports the median
   of the uniform-decode steps' times from the engine's step records (rank 0's host time:
   inputs, forward, sampling).

Writes DIR/tp-decode.md (default out/gpu). Needs two NVIDIA GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CORRECTNESS = """
import json, sys
from mini_vllm import LLM, SamplingParams
params = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(20, 60))]
out = {}
for tp in (1, 2):
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, tensor_parallel_size=tp)
    done = llm.generate(prompts, params, use_tqdm=False)
    out[tp] = [[o.token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.token_ids)]]
               for o in done]
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

TIMING = """
import json, statistics, sys
from mini_vllm import LLM, SamplingParams
model, batch, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(model, device="cuda", dtype="bfloat16", enforce_eager=True, max_num_seqs=max(batch, 1),
          max_model_len=512, tensor_parallel_size=tp)
params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
prompts = [[3 + (7 * i + j) % 200 for j in range(32)] for i in range(batch)]
llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
llm.engine.stats.steps.clear()
llm.generate(prompts, params, use_tqdm=False)
steps = [s.seconds for s in llm.engine.stats.steps if s.uniform_decode and s.num_reqs == batch]
print(json.dumps({"median_ms": 1000 * statistics.median(steps), "steps": len(steps)}))
"""


def run(code: str, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-3.2-1b-like")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--out", default="out/gpu")
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
    lines = [f"# Tensor parallelism on {torch.cuda.get_device_name(0)} x2", ""]

    result = json.loads(run(CORRECTNESS))
    same_tokens = all(a[0] == b[0] for a, b in zip(result["1"], result["2"]))
    worst = max(abs(x - y) for a, b in zip(result["1"], result["2"]) for x, y in zip(a[1], b[1]))
    lines.append(
        f"- correctness (tiny, float32, NCCL): tokens equal: {same_tokens}; "
        f"largest log-probability difference {worst:.2e}"
    )
    print(lines[-1], flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(LAUNCHED)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(script), tmp]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in (0, 1)
                 if (Path(tmp) / f"rank{r}.json").exists()]  # fmt: skip
        expected = [t[0] for t in result["1"][:2]]
        ok = done.returncode == 0 and len(ranks) == 2 and all(r == expected for r in ranks)
        why = next((r["error"] for r in ranks if isinstance(r, dict)), done.stderr[-1500:])
        lines.append(
            "- torchrun --nproc-per-node 2 (external_launcher): both ranks give the one-GPU "
            f"tokens: {ok}" + ("" if ok else f"\n\n```text\n{why}\n```\n")
        )
        print(lines[-1], flush=True)

    lines += [
        "",
        "| model | batch | TP=1 step ms | TP=2 step ms | TP=1 / TP=2 |",
        "|---|---|---|---|---|",
    ]
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",") if b):
            t = {tp: json.loads(run(TIMING, model, str(batch), str(tp))) for tp in (1, 2)}
            one, two = t[1]["median_ms"], t[2]["median_ms"]
            lines.append(f"| {model} | {batch} | {one:.3f} | {two:.3f} | {one / two:.2f} |")
            print(lines[-1], flush=True)
    (out / "tp-decode.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
