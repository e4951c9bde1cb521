"""The `serve` command every service shares: one declaration (`serve_command`) gives a service its click command with
the common options (host, port, token, body limit, parent watch, log level), its resolved token, logging, the uvicorn
runner and clean error exits; the service states only its own options and how it builds its app."""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from fastapi import FastAPI

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.services import DEFAULT_TOKEN_ENV, token_file_env
from verl_grpo.services.http import DEFAULT_MAX_BODY_BYTES, load_token

logger = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
        """Serve until SIGTERM/SIGINT (uvicorn drains in-flight requests first)."""
        import uvicorn

        if self.exit_with_parent:
            _watch_parent()
        uvicorn.run(app, host=self.host, port=self.port, log_level=self.log_level, access_log=True,
                    timeout_graceful_shutdown=10, server_header=False)


def serve_command(group: click.Group, default_port: int, *options: Callable) -> Callable:
    """Declare a service's `serve` command on `group`: the shared options (serve_options) arrive as one `Serving`,
    the first argument, logging is configured before the service builds its state, `options` are the service's own
    click options (its remaining arguments), and the package's errors end the process cleanly (cli_errors).

        @serve_command(cli, SPEC.port, click.option("--max-items", type=int, default=4096))
        def serve(serving: Serving, max_items: int) -> None:
            serving.run(build_app(..., serving.token, serving.max_body_bytes, max_items))
    """
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(host: str, port: int, token_env: str, token_file: str | None, no_auth: bool,
                    max_body_bytes: int, exit_with_parent: bool, log_level: str, **own: Any) -> Any:
            logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
            token = resolve_token(host, token_env, token_file, no_auth)
            return fn(Serving(host, port, token, max_body_bytes, exit_with_parent, log_level), **own)

        return group.command("serve")(_with_options(cli_errors(command), [*serve_options(default_port), *options]))

    return decorate


def serve_options(default_port: int) -> list[Callable]:
    """The click options every `serve` command shares, in the order --help lists them."""
    return [
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


def _with_options(fn: Callable, options: list[Callable]) -> Callable:
    """`fn` decorated by `options`, the first listed first in --help (decorators apply bottom-up)."""
    for option in reversed(options):
        fn = option(fn)
    return fn


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
