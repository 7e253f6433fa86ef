"""Phase 05: one CUDA graph by hand, with nothing but `torch.cuda.graph` (GPU-REQ).

The pattern every later graph in the course repeats, in its smallest form:
1. a static input: one tensor whose address the graph will read on every replay;
2. a warm-up on a side stream, so that one-off work (cuBLAS handles, kernel loading)
   happens before the capture and not inside it;
3. the capture: inside `torch.cuda.graph`, the step's kernels are recorded, not run, and
   its output is allocated from the graph's private memory pool;
4. for each new input, `copy_` it INTO the static input, then `replay()`: one launch for
   every recorded kernel, writing the same output tensor each time.

Counterparts:
- PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture) and
  `torch.cuda.graph`, `torch.cuda.CUDAGraph.replay`;
- the CPU simulator of the same rules: mini_vllm/teaching/cudagraph.py (`GraphRunner`);
- the engine: mini_vllm/compilation/cuda_graph.py (`CUDAGraphWrapper`, steps 3 and 4, one
  graph per batch descriptor), mini_vllm/compilation/graph_backend.py (step 2) and the
  model runner's persistent buffers (step 1);
- vLLM: vllm/compilation/cuda_graph.py (`CUDAGraphWrapper.__call__`) and
  vllm/v1/worker/gpu_model_runner.py (`GPUModelRunner.capture_model`, persistent buffers).

`capture_and_replay` is the pattern alone (the chapter shows it); `replay_with_graph` checks
its inputs first and refuses, with a `UserError` that says so, where there is no CUDA.
Run it on a GPU: `python -m mini_vllm.teaching.cuda_graph_basics`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mini_vllm.errors import UserError

__all__ = ["capture_and_replay", "make_step", "replay_with_graph", "require_cuda"]

Step = Callable[[torch.Tensor], torch.Tensor]


def make_step(hidden: int = 64, *, device: str | torch.device = "cuda", seed: int = 0) -> Step:
    """A stand-in for one decode step: an RMS norm, two matrix products, an activation and
    a residual add, several small kernels with no host sync and no data-dependent branch."""
    generator = torch.Generator().manual_seed(seed)
    w_up = torch.randn(hidden, 4 * hidden, generator=generator) / hidden**0.5
    w_down = torch.randn(4 * hidden, hidden, generator=generator) / (4 * hidden) ** 0.5
    w_up, w_down = w_up.to(device), w_down.to(device)

    def step(x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + torch.nn.functional.silu(h @ w_up) @ w_down

    return step


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise UserError(
            "torch.cuda.graph needs an NVIDIA GPU with CUDA, and torch.cuda.is_available() "
            "is False here; the CPU simulator mini_vllm/teaching/cudagraph.py shows the same "
            "rules (static input, capture, copy in, replay) without one"
        )


def replay_with_graph(
    step: Step, inputs: Sequence[torch.Tensor], warmup: int = 3
) -> list[torch.Tensor]:
    """Capture `step` once, then run it on every tensor of `inputs` by graph replay.

    Returns one output per input, cloned, since each replay overwrites the same tensor.
    All inputs must share one shape and dtype: a graph is recorded for one shape.
    """
    if not inputs:
        raise ValueError("replay_with_graph needs at least one input")
    shapes = {(tuple(x.shape), x.dtype) for x in inputs}
    if len(shapes) > 1:
        raise ValueError(
            f"a CUDA graph is recorded for one shape, and these inputs have {len(shapes)} "
            f"({sorted(str(s) for s in shapes)}); capture one graph per shape"
        )
    require_cuda()
    if inputs[0].device.type != "cuda":
        raise ValueError(f"the inputs must be CUDA tensors, not {inputs[0].device.type}")
    with torch.cuda.device(inputs[0].device):
        return capture_and_replay(step, inputs, warmup)


# ANCHOR: cuda_graph_basics
def capture_and_replay(step: Step, inputs: Sequence[torch.Tensor], warmup: int) -> list:
    static_x = inputs[0].clone()  # 1. the one address every replay reads
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # 2. warm up off the capture stream
        for _ in range(warmup):
            step(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # 3. record the kernels; nothing runs
        static_out = step(static_x)
    outputs = []
    for x in inputs:
        static_x.copy_(x)  # 4. new data INTO the recorded input...
        graph.replay()  # ...then one launch for every kernel
        outputs.append(static_out.clone())  # the next replay overwrites static_out
    return outputs


# ANCHOR_END: cuda_graph_basics


def main() -> None:
    require_cuda()
    torch.manual_seed(0)
    step = make_step(device="cuda")
    inputs = [torch.randn(8, 64, device="cuda") for _ in range(4)]
    replayed = replay_with_graph(step, inputs)
    worst = max((r - step(x)).abs().max().item() for r, x in zip(replayed, inputs))
    print(
        f"{len(inputs)} inputs, one capture, {len(inputs)} replays; "
        f"largest difference from eager: {worst:.3g}"
    )


if __name__ == "__main__":
    main()
