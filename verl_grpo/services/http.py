"""What every service shares: bearer-token auth, request size limit, JSON errors, /health and the `serve` runner.

Errors always have the shape `{"error": {"code": ..., "message": ..., "details": [...]}}`. Request bodies
are never echoed back (they may be huge or hold garbage), and the token is never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.services import DEFAULT_TOKEN_ENV, token_file_env

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 << 20
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate from a client's `\\ud800` cannot break the encoding."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class ServiceError(Exception):
    """An error a handler raises on purpose: HTTP status, machine-readable code, human message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Health(BaseModel):
    status: str = "ok"
    service: str
    uptime_s: float
    info: dict[str, Any] = {}


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] = []


class ErrorResponse(BaseModel):
    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 409, 413, 422, 500, 503)
}
"""OpenAPI description of the structured errors every route may return."""


def load_token(token_env: str = DEFAULT_TOKEN_ENV, token_file: str | None = None) -> str | None:
    """The bearer token: `--token-file`, else env `<token_env>`, else the file in env `<token_env>_FILE`."""
    path = token_file or os.environ.get(token_file_env(token_env))
    if not path and os.environ.get(token_env):
        return os.environ[token_env].strip() or None
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise ConfigError(f"token file {path} (from {token_file_env(token_env)} or --token-file) "
                              f"cannot be read: {e.strerror}; point it at a readable file") from None
        if not token:
            raise ConfigError(f"token file {path} is empty; write the bearer token into it")
        return token
    return None


def error_json(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> SafeJSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return SafeJSONResponse(body, status_code=status, headers=headers)


class BodyLimitMiddleware:
    """Reject bodies over `max_bytes` with 413 before the app parses them (Content-Length or streamed)."""

    def __init__(self, app: Callable, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: dict, receive: Callable, send: Callable) -> None:
        response = error_json(413, "body_too_large", f"request body exceeds {self.max_bytes} bytes; send smaller "
                                                     "batches")
        await response(scope, receive, send)


@dataclass(frozen=True)
class OwnHealth:
    """The GET /health of a service whose API fixes its own body: `model` is its response model, `body(uptime_s)`
    its answer. Answered on the event loop, so a thread pool full of requests waiting on the model never starves the
    health checks (a rollout router's, say)."""

    model: type[BaseModel]
    body: Callable[[float], BaseModel]


def create_app(
    service: str,
    token: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    description: str = "",
    lifespan: Callable | None = None,
    health_info: Callable[[], dict[str, Any]] | None = None,
    own_health: OwnHealth | None = None,
) -> tuple[FastAPI, Callable]:
    """A FastAPI app with the shared behaviour; returns (app, auth dependency to put on protected routers).

    token None disables auth (the `serve` CLI only allows that on a loopback host with --no-auth). GET /health
    answers the shared `Health` (with `health_info()` as its info), or `own_health`'s body.
    """
    started = time.monotonic()
    app = FastAPI(title=f"verl-grpo {service}", description=description, default_response_class=SafeJSONResponse,
                  lifespan=lifespan)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description=f"Bearer token from {DEFAULT_TOKEN_ENV}")
    expected = token.encode() if token else None

    def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if expected is None:
            return
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise ServiceError(401, "unauthorized", "missing bearer token; send 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise ServiceError(401, "unauthorized", "wrong bearer token")

    if own_health is not None:
        @app.get("/health", response_model=own_health.model, tags=["meta"])
        async def own() -> BaseModel:
            return own_health.body(round(time.monotonic() - started, 3))
    else:
        @app.get("/health", response_model=Health, tags=["meta"])
        def health() -> Health:
            return Health(service=service, uptime_s=round(time.monotonic() - started, 3),
                          info=health_info() if health_info else {})

    _install_error_handlers(app)
    return app, require_token


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> SafeJSONResponse:
        return error_json(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_json(400, "invalid_json", "request body is not valid JSON (UTF-8)")
        details = [{"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg", ""),
                    "type": e.get("type", "")}
                   for e in errors[:20]]
        fields = ", ".join(d["loc"] for d in details[:5])
        return error_json(422, "invalid_request", f"request does not match the schema at: {fields}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        code = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_json(exc.status_code, code, str(exc.detail))

    @app.exception_handler(DataError)
    async def _data(request: Request, exc: DataError) -> SafeJSONResponse:
        return error_json(422, "invalid_data", str(exc))

    @app.exception_handler(InfraError)
    async def _infra(request: Request, exc: InfraError) -> SafeJSONResponse:
        logger.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_json(503, "unavailable", f"{exc}; retry later")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> SafeJSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return error_json(500, "internal_error", f"{type(exc).__name__} while handling the request (see the server "
                                                 "log)")


# ---- the `serve` CLI -------------------------------------------------------------------------------------------------

def service_cli(about: str) -> click.Group:
    """A service module's command group (`python -m verl_grpo.services.<module> serve ...`); `about` is its help."""
    return click.Group(help=about)


@dataclass(frozen=True)
class Serving:
    """What every `serve` command shares, from its common options: where it listens, its resolved token (None with
    --no-auth on loopback), the request size limit, the parent watch and the log level."""

    host: str
    port: int
    token: str | None
    max_body_bytes: int
    exit_with_parent: bool
    log_level: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def run(self, app: FastAPI) -> None:
        run_server(app, self.host, self.port, self.log_level, self.exit_with_parent)


def serve_command(group: click.Group, default_port: int, *options: Callable) -> Callable:
    """Declare a service's `serve` command on `group`: the shared options (serve_options) arrive as one `Serving`,
    the first argument, logging is configured before the service builds its state, `options` are the service's own
    click options (its remaining arguments), and the package's errors end the process cleanly (cli_errors).

        @serve_command(cli, SPEC.port, click.option("--max-items", type=int, default=4096))
        def serve(serving: Serving, max_items: int) -> None:
            serving.run(build_app(..., serving.token, serving.max_body_bytes, max_items))
    """
    import functools

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(host: str, port: int, token_env: str, token_file: str | None, no_auth: bool,
                    max_body_bytes: int, exit_with_parent: bool, log_level: str, **own: Any) -> Any:
            logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
            token = resolve_token(host, token_env, token_file, no_auth)
            return fn(Serving(host, port, token, max_body_bytes, exit_with_parent, log_level), **own)

        wrapped = cli_errors(command)
        for option in reversed(options):
            wrapped = option(wrapped)
        return group.command("serve")(serve_options(default_port)(wrapped))

    return decorate


def serve_options(default_port: int) -> Callable:
    """Click options every `serve` command shares."""

    def decorate(fn: Callable) -> Callable:
        options = [
            click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind."),
            click.option("--port", type=int, default=default_port, show_default=True),
            click.option("--token-env", default=DEFAULT_TOKEN_ENV, show_default=True,
                         help="Env var with the bearer token (or <NAME>_FILE naming a file with it)."),
            click.option("--token-file", type=click.Path(dir_okay=False), default=None,
                         help="File holding the bearer token (overrides the env var)."),
            click.option("--no-auth", is_flag=True, help="Serve without a token (loopback hosts only, for debugging)."),
            click.option("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, show_default=True),
            click.option("--exit-with-parent", is_flag=True,
                         help="Stop when the process that started this one exits (local job group)."),
            click.option("--log-level", default="info", show_default=True),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def resolve_token(host: str, token_env: str, token_file: str | None, no_auth: bool) -> str | None:
    """The server's token, or None with --no-auth on loopback; ConfigError when neither is available."""
    if no_auth:
        if not _is_loopback(host):
            raise ConfigError(f"--no-auth is only allowed on a loopback host, not {host!r}; set {token_env} instead")
        return None
    token = load_token(token_env, token_file)
    if token is None:
        raise ConfigError(f"no bearer token: set {token_env} (or {token_file_env(token_env)} to a file holding it), "
                          "or pass --token-file; --no-auth serves without one on 127.0.0.1")
    return token


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_server(app: FastAPI, host: str, port: int, log_level: str = "info", exit_with_parent: bool = False) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn drains in-flight requests first)."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    if exit_with_parent:
        _watch_parent()
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=True, timeout_graceful_shutdown=10,
                server_header=False)


def _watch_parent(poll_s: float = 1.0) -> None:
    """SIGTERM ourselves once our parent is gone, so a killed orchestrator leaves no orphan service behind."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        logger.warning("parent process %d exited; shutting down", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def cli_errors(fn: Callable) -> Callable:
    """Turn the package's user-facing errors into a clean exit with code 2 (config/data) or 1 (infra)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigError, DataError) as e:
            click.echo(f"error ({type(e).__name__}): {e}", err=True)
            raise SystemExit(2) from None
        except InfraError as e:
            click.echo(f"error ({type(e).__name__}): {e}", err=True)
            raise SystemExit(1) from None

    return wrapper
