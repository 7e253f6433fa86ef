"""The OpenAI-compatible HTTP server: a FastAPI app, served by uvicorn.

vLLM counterpart: vllm/entrypoints/openai/api_server.py (`build_app`, `run_server`; the
`/health` and `/metrics` routes, the exception handlers of vllm/entrypoints/openai/server_utils.py)
and the routers of vllm/entrypoints/openai/{completion,chat_completion,models}/api_router.py.

Routes:
- `POST /v1/completions`, `POST /v1/chat/completions`: streamed (server-sent events) or whole;
- `GET /v1/models`: the one model served, by its served name;
- `GET /health`: 503 until the engine has loaded the weights, compiled and captured every
  graph of its ladder (the warm-up), 200 after: a load balancer's readiness probe;
- `GET /metrics`: Prometheus text format (mini_vllm/entrypoints/metrics.py).

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 422 for a body
that does not fit the schema (a field missing or of the wrong type), 400 for a value the engine
cannot take or for a body that is not JSON, 404 for a model or a path this server does not
have, 503 during the warm-up, 500 for a failure of the server itself.

    app = build_app(AsyncLLM(lambda: LLM("tiny")), served_model_name="tiny")
    with ServerThread(app) as server:       # uvicorn in a thread, on a free port
        print(server.url)                   # http://127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from mini_vllm.entrypoints.async_llm import AsyncLLM
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from mini_vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from mini_vllm.entrypoints.openai.serving_engine import ServingError, error_body

__all__ = ["ServerThread", "build_app"]

logger = logging.getLogger(__name__)


def _error(message: str, status_code: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status_code, param), status_code=status_code)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """Pydantic's complaint about the body, as one OpenAI error naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return _error(f"the request body is not valid JSON ({first.get('msg')})", 400)
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    # A union (the completion prompt) lists one error per member: name the field once.
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "the body"
    if first.get("type") == "missing":
        message = f"the request lacks `{where}`" if loc else "the request has no JSON body"
    else:
        message = f"`{where}`: {first.get('msg')}, got {first.get('input')!r}"
    return _error(f"{message}; see the OpenAI API reference for the field", 422, param)


def build_app(
    async_llm: AsyncLLM,
    served_model_name: str,
    chat_template: str | None = None,
    metrics: PrometheusStatLogger | None = None,
) -> FastAPI:
    """The app. Its lifespan starts the engine thread (the warm-up runs while the server
    already answers `/health` with 503) and stops it on shutdown."""
    metrics = metrics if metrics is not None else async_llm.metrics
    completions = OpenAIServingCompletion(async_llm, served_model_name)
    chat = OpenAIServingChat(async_llm, served_model_name, chat_template)

    # ANCHOR: lifespan
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_llm.start()
        try:
            yield
        finally:
            # Off the event loop: the step in progress may take a while to finish.
            await asyncio.to_thread(async_llm.shutdown)

    # ANCHOR_END: lifespan

    app = FastAPI(title="mini_vllm", lifespan=lifespan)
    app.state.async_llm = async_llm

    @app.exception_handler(ServingError)
    async def serving_error(_: Request, exc: ServingError) -> JSONResponse:
        return _error(exc.message, exc.status_code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (
                f"no route {request.method} {request.url.path}: this server has "
                "/v1/completions, /v1/chat/completions, /v1/models, /health and /metrics"
            )
        return _error(message, exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("the server failed on a request")
        return _error(f"the server failed: {type(exc).__name__}: {exc}", 500)

    # ANCHOR: health
    @app.get("/health")
    async def health() -> JSONResponse:
        if async_llm.is_ready:
            return JSONResponse({"status": "ready"})
        if async_llm.startup_error is not None:
            body = {"status": "failed", "error": str(async_llm.startup_error)}
        elif async_llm.llm is not None:
            body = {"status": "stopped"}
        else:
            body = {"status": "warming up: loading, compiling, capturing CUDA graphs"}
        return JSONResponse(body, status_code=503)

    # ANCHOR_END: health

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        if metrics is None:
            return _error("this server was built without metrics", 404)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def show_models() -> JSONResponse:
        llm = async_llm.llm
        max_len = llm.engine.max_model_len if llm is not None else None
        models = ModelList(data=[ModelCard(id=served_model_name, max_model_len=max_len)])
        return JSONResponse(models.model_dump(mode="json"))

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
        return await completions.create_completion(request, raw_request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(
        request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        return await chat.create_chat_completion(request, raw_request)

    return app


class ServerThread:
    """uvicorn serving `app` in a background thread, on a socket bound first (port 0: a free
    port, read back from the socket): for tests and for `bench serve`. Signals stay with the
    main thread; `stop()` (or leaving the `with`) shuts the server and its engine down."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(
            app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start, and wait until the server accepts connections (not until the engine is warm:
        poll `/health` for that)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
