"""Random initialisation on the GPU (GPU-REQ; the layers on CPU:
tests/engine/test_llama_layers.py).

A `tiny` model built and seeded on CUDA holds, parameter for parameter, the very numbers
the same seed gives a CPU model.
"""

from __future__ import annotations

import pytest
import torch


@pytest.mark.gpu
def test_random_init_gives_a_cuda_model_the_cpu_models_numbers():
    from mini_vllm.models import loader

    config = loader.get_model_config("tiny")
    models = []
    for device in ("cpu", "cuda"):
        model = loader.build_model(config, torch.device(device), torch.float32)
        loader.random_init(model, seed=2)
        models.append(model)
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert torch.equal(a, b.cpu()), name
