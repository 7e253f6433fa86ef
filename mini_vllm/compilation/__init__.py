"""Phase 05's real path: CUDA-graph wrappers, the CPU graph backend, and compilation."""
