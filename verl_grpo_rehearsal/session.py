"""One rehearsal of a cloud launch on this machine: what `verl-grpo launch --rehearse` sets up around the real flow.

The flow, the provider and the rendered YAML are the ones a real launch uses; the session only swaps the `sky`
boundary for the local rehearsal (`VERL_GRPO_REHEARSAL_DIR`), serves an S3 store on 127.0.0.1 when the run's
store is on this machine (the nodes reach the store only through S3, as on a cloud), keeps the rehearsal's MLflow
registry apart from the user's, and asks for injected preemptions / a user-code failure. Everything it starts is
stopped when the session ends.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.local_paths import state_dir
from verl_grpo_rehearsal import ENV_DRIVER, ENV_FAIL_AT, ENV_PREEMPT_AT, launch_env

BUCKET = "verl-grpo-rehearsal"
DEFAULT_ACCELERATORS = "H100:1"
"""What a rehearsal prices and renders for when the config names no accelerators."""


@dataclass
class Session:
    """A running rehearsal: where it keeps its state, and the overrides that point the run at it."""

    root: Path
    overrides: list[str] = field(default_factory=list)


def rehearsal_overrides(cfg: RunConfig, root: Path, store_endpoint: str | None) -> list[str]:
    """Config overrides of a rehearsal: the loopback store (when one is served), the rehearsal's own MLflow registry
    and, when the config names none, the accelerators the YAML is rendered and priced for."""
    overrides = [f"tracking.mlflow_uri=sqlite:///{root / 'mlflow.db'}"]
    if store_endpoint:
        overrides += [f"storage.uri=s3://{BUCKET}/store", f"storage.endpoint_url={store_endpoint}"]
    if not cfg.infra.accelerators:
        overrides.append(f"infra.accelerators={DEFAULT_ACCELERATORS}")
    return overrides


@contextmanager
def rehearsal_session(cfg: RunConfig, preempt_at: Sequence[int] = (), fail_at: int | None = None,
                      root: Path | None = None, driver: str | None = None) -> Iterator[Session]:
    """Set up a rehearsal for cfg (the config as the user gave it) and tear everything down afterwards. `driver`: the
    NVIDIA driver version its GPU nodes report (`nvidia-smi`), else the rehearsal's default."""
    from verl_grpo_rehearsal import sky_boundary

    root = root or state_dir() / "rehearsals" / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    root.mkdir(parents=True, exist_ok=True)
    env = {**launch_env(str(root / "sky")), ENV_PREEMPT_AT: ",".join(str(s) for s in sorted(set(preempt_at)))}
    if fail_at is not None:
        env[ENV_FAIL_AT] = str(fail_at)
    if driver is not None:
        env[ENV_DRIVER] = driver
    server = None
    if not cfg.storage.uri.startswith("s3://"):
        server, endpoint = _serve_s3()
        # moto accepts any key; the user's own credentials must never travel to the rehearsal's nodes. A random key
        # id, like a real one, appears nowhere else (the dry run's leak check looks for it in the rendered YAML).
        env |= {"AWS_ACCESS_KEY_ID": f"REHEARSAL{secrets.token_hex(6).upper()}",
                "AWS_SECRET_ACCESS_KEY": secrets.token_hex(8), "AWS_DEFAULT_REGION": "us-east-1"}
        env["AWS_SESSION_TOKEN"] = ""
    else:
        endpoint = None
    saved = _set_env(env)
    try:
        if server is not None:
            _create_bucket(endpoint)
        yield Session(root=root, overrides=rehearsal_overrides(cfg, root, endpoint))
    finally:
        try:
            sky_boundary.stop_all()
        finally:
            _set_env(saved)
            if server is not None:
                server.stop()


def _serve_s3():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def _create_bucket(endpoint: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)


def _set_env(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (or with None/"" unset) each variable; returns the previous values, to restore with this same call."""
    previous = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    return previous
