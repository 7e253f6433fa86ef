"""`python -m mini_vllm serve --model NAME [--host H] [--port P] [engine options]`: the
OpenAI-compatible server.

vLLM counterpart: vllm/entrypoints/cli/serve.py (`vllm serve`) and the engine flags of
vllm/engine/arg_utils.py (`EngineArgs.add_cli_args`). Every field of `EngineConfig` (what
`LLM(...)` takes) is a flag here, by the same name with dashes: `--max-num-seqs 32`,
`--enforce-eager`, `--cudagraph-mode full_and_piecewise`, `--compilation-mode vllm_compile`,
`--async-scheduling`, ... The server answers at once; `/health` says 503 until the model is
loaded, compiled and every graph captured, then 200. Ctrl-C (SIGINT) or SIGTERM stops it:
the requests in flight get --shutdown-timeout seconds to finish, then each one still running
ends with an error (a stream: an error event, then `data: [DONE]`) and the engine stops.

Who may talk to it. It listens on 127.0.0.1 by default (vLLM's default is every interface):
only this machine reaches it. `--api-key KEY` (or $MINI_VLLM_API_KEY; vLLM's --api-key and
$VLLM_API_KEY) makes every /v1 route want `Authorization: Bearer KEY`; /health and /metrics
stay open, as in vLLM. The Host header must name the server: on a loopback address, localhost,
127.0.0.1 or ::1 (so a web page whose DNS name is rebound to 127.0.0.1 is refused); with
`--allowed-hosts NAME ...`, those names and the address it listens on (`*`: any host, vLLM's
behaviour, and the default on any other address). It sends no CORS headers and reads bodies only
as application/json, so a page of another origin can neither read its answers nor start a
generation. `--max-request-body-bytes` (16 MiB) refuses a larger body with a 413.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import logging
import os
import signal
import socket
import sys

from mini_vllm.cli.options import model_options, option

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024  # api_server's; that module needs fastapi
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1"]

# Every EngineConfig field but model, device and dtype (model_options) and usage_context (set
# by the command): (help, argparse options). A flag without a default leaves the engine's.
ENGINE_FLAGS: dict[str, tuple[str, dict]] = {
    "seed": ("seed of the random weights and of unseeded sampling", dict(type=int, default=0)),
    "cpu_threads": (
        "intra-op CPU threads while stepping: auto (PyTorch's setting) or a number",
        dict(default="auto"),
    ),
    "max_num_seqs": (
        "requests in one batch at most (default: 16 on CPU; on a GPU vLLM's, 1024 with 70 GiB "
        "or more, an A100 excepted, else 256)",
        dict(type=int),
    ),
    "max_num_batched_tokens": (
        "tokens one step may compute (default: 2048 on CPU; on a GPU vLLM's server default, "
        "8192 with 70 GiB or more, an A100 excepted, else 2048)",
        dict(type=int),
    ),
    "max_model_len": ("context length (default: the model's)", dict(type=int)),
    "enable_chunked_prefill": (
        "split long prompts over several steps",
        dict(action=argparse.BooleanOptionalAction, default=True),
    ),
    "block_size": ("tokens per KV block (a power of two)", dict(type=int, default=16)),
    "num_kv_blocks": ("the KV cache's size in blocks (default: from memory)", dict(type=int)),
    "kv_cache_memory_bytes": ("the KV cache's size in bytes", dict(type=int)),
    "gpu_memory_utilization": (
        "the fraction of the GPU's memory this engine may use, in (0, 1]: weights, "
        "activations, CUDA graphs, and the KV cache sized from what is left (CUDA only)",
        dict(type=float, default=0.9),
    ),
    "enable_prefix_caching": ("share the KV blocks of common prefixes", dict(action="store_true")),
    "enforce_eager": ("no CUDA graphs, no compilation", dict(action="store_true")),
    "cudagraph_mode": (
        "none, piecewise, full, full_decode_only or full_and_piecewise (default: "
        "full_and_piecewise on CUDA, none on CPU)",
        dict(),
    ),
    "cudagraph_capture_sizes": (
        "comma-separated batch sizes to capture (default: vLLM's ladder)",
        dict(),
    ),
    "debug_cudagraphs": ("check input addresses on every replay", dict(action="store_true")),
    "compilation_mode": (
        "none, stock_torch_compile, dynamo_trace_once or vllm_compile (or 0-3)",
        dict(default="none"),
    ),
    "custom_ops": (
        "which layers run mini_vllm's own kernels: all, none, then +name or -name, "
        "comma-separated (rms_norm, rotary_embedding, silu_and_mul, linear, "
        "paged_attention; default: $MINI_VLLM_CUSTOM_OPS, else all)",
        dict(),
    ),
    "enable_fusion": (
        "vllm_compile's fusion pass (default: on with CUDA)",
        dict(action=argparse.BooleanOptionalAction),
    ),
    "async_scheduling": (
        "plan step N+1 while the device runs step N",
        dict(action="store_true"),
    ),
    "tensor_parallel_size": (
        "ranks the model is split over, one process each on this machine (CPU: at most the "
        "cores; CUDA: GPUs 0..N-1); eager only for now",
        dict(type=int, default=1),
    ),
    "distributed_executor_backend": (
        "who starts the ranks: mp (this process, one a rank) or external_launcher (torchrun "
        "started each rank, which runs the whole engine)",
        dict(default="mp", choices=["mp", "external_launcher"]),
    ),
}


def add_engine_options(parser: argparse.ArgumentParser, model: str = "smollm2-135m-instruct"):
    """--model, --device, --dtype and one flag per other EngineConfig field."""
    model_options(parser, model=model)
    group = parser.add_argument_group("engine options (the fields of EngineConfig / LLM(...))")
    for name, (help_text, kwargs) in ENGINE_FLAGS.items():
        option(group, "--" + name.replace("_", "-"), help_text, dest=name, **kwargs)


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The engine options as `LLM(...)` keyword arguments."""
    from mini_vllm.errors import UserError

    kwargs: dict[str, object] = dict(model=args.model, device=args.device)
    kwargs["dtype"] = None if args.dtype == "auto" else args.dtype
    for name in ENGINE_FLAGS:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    if isinstance(kwargs["cpu_threads"], str) and kwargs["cpu_threads"] != "auto":
        try:
            kwargs["cpu_threads"] = int(kwargs["cpu_threads"])
        except ValueError:
            raise UserError(
                f"--cpu-threads must be auto or a number, got {args.cpu_threads!r}"
            ) from None
    sizes = kwargs.get("cudagraph_capture_sizes")
    if isinstance(sizes, str):
        try:
            kwargs["cudagraph_capture_sizes"] = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise UserError(
                f"--cudagraph-capture-sizes must be comma-separated integers, got {sizes!r}"
            ) from None
    return kwargs


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine options as command-line words (to start `serve` in another process)."""
    words = ["--model", args.model, "--device", args.device, "--dtype", args.dtype]
    for name, (_, kwargs) in ENGINE_FLAGS.items():
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        default = kwargs.get("default", False if kwargs.get("action") == "store_true" else None)
        if value is None or value == default:
            continue
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, str(value)]
    return words


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible server (/v1/completions, /v1/chat/completions, /metrics)",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog=" ".join(__doc__.split("\n\n")[2].split()),  # who may talk to the server
    )
    add_engine_options(p)
    server = p.add_argument_group("server options")
    option(server, "--host", "address to listen on (0.0.0.0: every interface)", default="127.0.0.1")
    option(server, "--port", "port to listen on (0: any free port)", type=int, default=8000)
    option(
        server,
        "--served-model-name",
        "the name clients put in `model` (default: --model)",
    )
    option(
        server,
        "--chat-template",
        "a Jinja chat template (a file, or the text) for a model without one",
    )
    option(
        server,
        "--uvicorn-log-level",
        "uvicorn's log level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    option(server, "--access-log", "log every HTTP request", action="store_true")
    option(
        server,
        "--shutdown-timeout",
        "seconds the requests in flight get to finish after SIGINT/SIGTERM; then each one "
        "still running ends with an error (a stream: an error event, then data: [DONE])",
        type=int,
        default=5,
    )
    option(
        server,
        "--api-key",
        "every /v1 request must send `Authorization: Bearer KEY` with one of these keys; "
        "/health and /metrics stay open (default: $MINI_VLLM_API_KEY, else no key)",
        nargs="+",
        metavar="KEY",
    )
    option(
        server,
        "--allowed-hosts",
        "the names clients may put in the Host header, besides the address listened on "
        "(*: any; *.example.com: its subdomains; default: localhost, 127.0.0.1 and ::1 on a "
        "loopback address, any host on others)",
        nargs="+",
        metavar="HOST",
    )
    option(
        server,
        "--max-request-body-bytes",
        "the largest request body read; a larger one is refused with a 413",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
    )


def _bind(host: str, port: int) -> socket.socket:
    from mini_vllm.errors import UserError

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port "
            "(0: any free port) or --host"
        ) from None
    return sock


def require_serving_packages() -> None:
    """The server's and the load generator's packages, or a UserError saying how to add them."""
    import importlib.util

    from mini_vllm.errors import UserError

    modules = {"fastapi": "fastapi", "uvicorn": "uvicorn", "pydantic": "pydantic"}
    modules |= {"prometheus_client": "prometheus_client", "httpx": "httpx", "zmq": "pyzmq"}
    missing = [pip for module, pip in modules.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise UserError(
            f"serving needs {', '.join(missing)}, not installed here: pip install "
            f"{' '.join(missing)} (pip install -e . installs them with mini_vllm; without an "
            "index, from a folder of wheels: pip install --no-index --find-links DIR ...)"
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def access_options(args: argparse.Namespace, host: str) -> dict[str, object]:
    """`build_app`'s api_keys, allowed_hosts and max_request_body_bytes from the flags, the
    environment, and `host`, the address listened on."""
    from mini_vllm.errors import UserError

    if args.max_request_body_bytes < 1:
        raise UserError(
            f"--max-request-body-bytes must be a positive number of bytes, got "
            f"{args.max_request_body_bytes}"
        )
    api_keys = args.api_key
    if api_keys is None and os.environ.get("MINI_VLLM_API_KEY"):
        api_keys = [os.environ["MINI_VLLM_API_KEY"]]
    if api_keys is not None and not all(key.strip() for key in api_keys):
        raise UserError("--api-key: an empty key would let anyone in; give a non-empty key")
    wildcard = host in ("", "0.0.0.0", "::")
    if args.allowed_hosts is not None:
        allowed = list(args.allowed_hosts) + ([] if wildcard else [host])
    elif _is_loopback(host):
        allowed = LOOPBACK_NAMES + ([] if host in LOOPBACK_NAMES else [host])
    else:
        allowed = None  # any Host, as vLLM
    return dict(
        api_keys=api_keys,
        allowed_hosts=allowed,
        max_request_body_bytes=args.max_request_body_bytes,
    )


def run(args: argparse.Namespace) -> int:
    require_serving_packages()
    from mini_vllm import envs
    from mini_vllm.engine.engine_config import EngineConfig
    from mini_vllm.entrypoints.async_llm import AsyncLLM
    from mini_vllm.entrypoints.metrics import PrometheusStatLogger
    from mini_vllm.entrypoints.openai.api_server import Server, build_app
    from mini_vllm.entrypoints.openai.serving_chat import load_chat_template
    from mini_vllm.errors import UserError
    from mini_vllm.llm import LLM
    from mini_vllm.models.loader import load_model_config

    # A server's defaults where the engine has two sets: on a GPU, a smaller step budget
    # than LLM(...)'s, as vLLM's OpenAI server (mini_vllm/engine/engine_config.py).
    kwargs = {**engine_kwargs(args), "usage_context": "openai_api_server"}
    EngineConfig.from_kwargs(**kwargs)  # a bad option fails now, before the server starts
    load_model_config(args.model)  # and so does an unknown model
    chat_template = load_chat_template(args.chat_template)
    if args.shutdown_timeout < 0:
        raise UserError("--shutdown-timeout must be >= 0 seconds")
    name = args.served_model_name or args.model
    access = access_options(args, args.host)
    sock = _bind(args.host, args.port)
    host, port = sock.getsockname()[:2]

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package_logger = logging.getLogger("mini_vllm")
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.INFO)

    failures: list[BaseException] = []
    server: Server | None = None

    def on_startup_failure(exc: BaseException) -> None:
        failures.append(exc)
        if server is not None:
            server.should_exit = True

    # The engine core in a process of its own (vLLM's default): the server's Python never
    # holds the interpreter lock a step is waiting for (mini_vllm/engine/core_client.py).
    async_llm = AsyncLLM(
        functools.partial(LLM, **kwargs),
        metrics=PrometheusStatLogger(name),
        on_startup_failure=on_startup_failure,
        multiprocess=envs.MINI_VLLM_ENABLE_MULTIPROCESSING,
    )
    app = build_app(async_llm, name, chat_template=chat_template, **access)
    server = Server(
        app,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.uvicorn_log_level,
        access_log=args.access_log,
    )
    shown = f"[{host}]" if ":" in host else host
    print(
        f"mini_vllm serve: {args.model} as {name!r} at http://{shown}:{port}/v1 ; GET /health "
        "answers 503 while the model loads, compiles and captures its graphs, then 200"
        + ("; /v1 wants an API key" if access["api_keys"] else ""),
        flush=True,
    )
    # uvicorn handles SIGINT and SIGTERM while it runs (a graceful shutdown), then raises the
    # signal again once done: both end here as a KeyboardInterrupt, and the exit status is 0.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    if failures:
        exc = failures[0]
        print(f"error: the engine failed to start: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
    return 0


def config_fields_without_flag() -> list[str]:
    """EngineConfig fields that `serve` has no flag for (the tests want none)."""
    from mini_vllm.engine.engine_config import EngineConfig

    # usage_context is the command's to set, not the user's: `serve` asks for the server's.
    covered = {"model", "device", "dtype", "usage_context", *ENGINE_FLAGS}
    return [f.name for f in dataclasses.fields(EngineConfig) if f.name not in covered]
