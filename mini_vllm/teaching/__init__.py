"""Teaching models: each shows one idea alone, and the engine never imports them.

- `cudagraph.py`: a numpy "GPU" that runs ops eagerly or captures them into a graph and
  replays it (Phase 05, labs 01 and 03); the course imports it as `mini_vllm.cudagraph`.
- `launch_overhead.py`: the two-lane (host issues, GPU runs) timeline of a decode step,
  eager against one graph launch, with presets for real model shapes (Phase 05, lab 02).
- `cuda_graph_basics.py`: the `torch.cuda.graph` pattern alone (static input, warm-up on a
  side stream, capture, copy in and replay), the one every graph of the engine follows
  (Phase 05's chapter).
- `decode_loop.py`: prefill then one token at a time over a contiguous KV cache, on the
  real model (Phase 00); `python -m mini_vllm generate` with one prompt runs it.

The engine's own versions of these ideas are in mini_vllm/compilation/ (graphs),
mini_vllm/engine/ (the loop, with a paged cache and continuous batching).
"""
