"""What every service's app shares: bearer-token auth, request size limit, JSON errors and /health (the `serve`
command they share is services/serving.py).

Errors always have the shape `{"error": {"code": ..., "message": ..., "details": [...]}}`. Request bodies
are never echoed back (they may be huge or hold garbage), and the token is never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
