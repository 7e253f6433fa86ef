"""The OpenAI-compatible HTTP server: a FastAPI app, served by uvicorn.

vLLM counterpart: vllm/entrypoints/openai/api_server.py (`build_app`, `run_server`; the
`/health` and `/metrics` routes) with vllm/entrypoints/openai/server_utils.py (the exception
handlers, `AuthenticationMiddleware`) and the routers of
vllm/entrypoints/openai/{completion,chat_completion,models}/api_router.py.

Routes:
- `POST /v1/completions`, `POST /v1/chat/completions`: streamed (server-sent events) or whole;
- `GET /v1/models`: the one model served, by its served name;
- `GET /health`: 503 until the engine has loaded the weights, compiled and captured every
  graph of its ladder (the warm-up), 200 after: a load balancer's readiness probe;
- `GET /metrics`: Prometheus text format (mini_vllm/entrypoints/metrics.py).

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a body
that does not fit the schema (vLLM's status; FastAPI's own would be 422), for a value the engine
cannot take and for a body that is not JSON; 401 without the API key; 404 for a model or a
path this server does not have; 413 for a body over the size limit; 503 during the warm-up;
500 for a failure of the server itself. A message quotes the request only in part.

What guards the server (`build_app`'s keyword arguments; `serve` has a flag for each):
- `max_request_body_bytes` (16 MiB by default): a larger body is refused with a 413, at once
  from its Content-Length, else as it arrives; vLLM has no such limit.
- `api_keys` (vLLM's `--api-key`): every `/v1` route wants `Authorization: Bearer <key>`;
  `/health` and `/metrics` stay open, as in vLLM.
- `allowed_hosts`: a request whose Host header names another host is refused (400), which
  stops a web page from reaching a server on 127.0.0.1 through a DNS name it rebinds there.
  No CORS headers are ever sent, and a body is read only as `application/json`, so a page of
  another origin can neither read an answer nor start a generation from the browser.

Shutdown (`Server`): the requests in flight get `shutdown_timeout` seconds to finish; then the
engine stops and each one still running ends with an error, a stream with an error event and
`data: [DONE]`, before the process exits. uvicorn alone would cancel their handlers, cutting
the streams mid-way.

    app = build_app(AsyncLLM(lambda: LLM("tiny")), served_model_name="tiny")
    with ServerThread(app) as server:       # uvicorn in a thread, on a free port
        print(server.url)                   # http://127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mini_vllm.entrypoints.async_llm import AsyncLLM
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    RequestFieldError,
    clip,
)
from mini_vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from mini_vllm.entrypoints.openai.serving_engine import ServingError, error_body

__all__ = ["DEFAULT_MAX_REQUEST_BODY_BYTES", "Server", "ServerThread", "build_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024
# After the shutdown timeout, the seconds the requests still running get to send their error
# (the engine stops after its step in progress first); then uvicorn cancels what is left.
STREAM_END_GRACE = 5.0


def _error(message: str, status_code: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status_code, param), status_code=status_code)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """Pydantic's complaint about the body, as one OpenAI error naming the field: a 400, as
    vLLM answers a schema error."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    kind = first.get("type")
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, RequestFieldError):  # the request's own validators
        return _error(cause.message, 400, cause.param)
    if kind == "json_invalid":
        return _error(f"the request body is not valid JSON ({first.get('msg')})", 400)
    if isinstance(first.get("input"), bytes):  # FastAPI reads only a JSON content type as JSON
        return _error("the request body must be sent with Content-Type: application/json", 400)
    loc = [str(part)[:100] for part in first.get("loc", ()) if part != "body"]
    # A union (the completion prompt) lists one error per member: name the field once.
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "the body"
    if kind == "missing":
        message = f"the request lacks `{where}`" if loc else "the request has no JSON body"
    elif kind == "extra_forbidden":
        message = f"unknown field `{where}`: check its spelling"
    else:
        message = f"`{where}`: {first.get('msg')}, got {clip(first.get('input'))}"
    return _error(f"{message}; see the OpenAI API reference for the field", 400, param)


# -- what guards the routes: pure ASGI middleware, which leaves streaming responses alone --------


def _host_name(host_header: str) -> str:
    """The host of a Host header, without its port: `[::1]:8000` -> `::1`."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostCheck:
    """A 400 for a request whose Host header is not one of `allowed_hosts` (`*`: any host;
    `*.example.com`: that domain's hosts), as starlette's TrustedHostMiddleware, with an
    OpenAI-shaped error that says which flag admits the host."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allowed = [host.strip().lower().strip("[]") for host in allowed_hosts]

    def allows(self, host: str) -> bool:
        return any(
            pattern == "*"
            or host == pattern
            or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            for pattern in self.allowed
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not self.allows(_host_name(host)):
                response = _error(
                    f"this server does not answer to the Host {clip(host)}; it answers to "
                    f"{', '.join(self.allowed)} (start it with --allowed-hosts NAME ... to add "
                    "the name clients use)",
                    400,
                )
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class ApiKeyCheck:
    """vLLM's `AuthenticationMiddleware`: a route under `/v1` answers only a request with
    `Authorization: Bearer <one of the keys>` (401 otherwise); `/health`, `/metrics` and CORS
    preflights (OPTIONS) stay open. Keys are compared as SHA-256 digests, in constant time."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        self.app = app
        self.digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]

    def authorized(self, headers: Headers) -> bool:
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(key.encode()).digest()
        found = False
        for known in self.digests:  # every key compared: the time tells nothing
            found |= secrets.compare_digest(digest, known)
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            headers = Headers(scope=scope)
            if path.startswith("/v1") and not self.authorized(headers):
                why = "a wrong API key" if "authorization" in headers else "no API key"
                response = _error(
                    f"this server wants an API key and the request has {why}: send the header "
                    "`Authorization: Bearer <key>` (the openai client sends its api_key so) "
                    "with the key the server was started with (--api-key or MINI_VLLM_API_KEY)",
                    401,
                )
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """A 413 for a request body over `max_bytes`: at once when its Content-Length says so,
    else as soon as the bytes received pass the limit (a chunked body has no length). The
    body is read whole here, before the route, which then reads it from memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _refusal(self, size: str) -> JSONResponse:
        return _error(
            f"the request body ({size}) is larger than this server's limit of {self.max_bytes} "
            "bytes: send a shorter prompt, or start the server with a larger "
            "--max-request-body-bytes",
            413,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._refusal(f"{int(length)} bytes")(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its whole body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refusal(f"more than {size} bytes")(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            # The body once, then the client's own messages (a disconnect, which the
            # handlers watch for).
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def build_app(
    async_llm: AsyncLLM,
    served_model_name: str,
    chat_template: str | None = None,
    metrics: PrometheusStatLogger | None = None,
    *,
    api_keys: Sequence[str] | None = None,
    allowed_hosts: Sequence[str] | None = None,
    max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
) -> FastAPI:
    """The app. Its lifespan starts the engine core (the warm-up runs while the server
    already answers `/health` with 503) and stops it on shutdown.

    `api_keys`: the keys a `/v1` request must bear (None: no key wanted); `allowed_hosts`:
    the Host names the server answers to (None: any); `max_request_body_bytes`: the largest
    body it reads (None: no limit)."""
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
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read it
            message = (
                f"the request body could not be read ({type(exc.__cause__).__name__}): send "
                "one JSON object, encoded as UTF-8"
            )
        elif exc.status_code == 404:
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
        elif async_llm.engine_error is not None:
            body = {"status": "failed", "error": f"the engine stopped: {async_llm.engine_error}"}
        elif async_llm.info is not None:
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
        info = async_llm.info
        max_len = info.max_model_len if info is not None else None
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

    # The last one added runs first: the Host, then the key, then the body's size, so that a
    # request refused for who sent it is refused before its body is read.
    if max_request_body_bytes is not None:
        app.add_middleware(BodySizeLimit, max_bytes=max_request_body_bytes)
    if api_keys:
        app.add_middleware(ApiKeyCheck, api_keys=list(api_keys))
    if allowed_hosts:
        app.add_middleware(HostCheck, allowed_hosts=list(allowed_hosts))
    return app


class Server(uvicorn.Server):
    """uvicorn's server, whose shutdown ends every request still running `shutdown_timeout`
    seconds after it began with an error, streams with an error event and `data: [DONE]`,
    before it exits. It stops the engine, which fails each request it holds with a 503 delta
    (AsyncLLM's drain); uvicorn alone would cancel the handlers at its timeout, mid-stream."""

    def __init__(self, app: FastAPI, shutdown_timeout: float = 5.0, **config: object) -> None:
        config["timeout_graceful_shutdown"] = shutdown_timeout + STREAM_END_GRACE
        super().__init__(uvicorn.Config(app, **config))
        self.async_llm: AsyncLLM = app.state.async_llm
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ender = asyncio.create_task(self._end_requests_after(self.shutdown_timeout))
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()

    async def _end_requests_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.server_state.tasks:
            logger.warning(
                "%d request(s) still running %g s after the shutdown began: ending them with "
                "an error (a stream gets an error event and [DONE])",
                len(self.server_state.tasks),
                seconds,
            )
        await asyncio.to_thread(self.async_llm.shutdown, STREAM_END_GRACE)


class ServerThread:
    """uvicorn serving `app` in a background thread, on a socket bound first (port 0: a free
    port, read back from the socket): for tests. Signals stay with the main thread; `stop()`
    (or leaving the `with`) shuts the server and its engine down as a signal would."""

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        shutdown_timeout: float = 5.0,
    ) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = host, self.socket.getsockname()[1]
        self.server = Server(
            app, shutdown_timeout=shutdown_timeout, log_level=log_level, access_log=False
        )
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
