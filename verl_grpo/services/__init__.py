"""The job group's auxiliary services: data-server, reward-server, retrieval-server and replay-buffer.

Each is a FastAPI app in its own module with a `serve` CLI (`python -m verl_grpo.services.<module> serve
--host H --port P`), the same command the SkyPilot job-group template runs. The trainer finds a service by
the URL in `VERL_GRPO_<TASK>_URL` (SkyPilot: `http://<task>-0.${SKYPILOT_JOBGROUP_NAME}:<port>`; locally a
127.0.0.1 port chosen by `local_group`) and authenticates with the bearer token in `VERL_GRPO_SERVICES_TOKEN`
(or the file named by `VERL_GRPO_SERVICES_TOKEN_FILE`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSpec:
    """One auxiliary service: its config name, job-group task name, module, default port and URL env var."""

    name: str
    task: str
    module: str
    port: int

    @property
    def url_env(self) -> str:
        return f"VERL_GRPO_{self.task.upper().replace('-', '_')}_URL"


SERVICES: dict[str, ServiceSpec] = {
    s.name: s
    for s in (
        ServiceSpec("data", "data-server", "verl_grpo.services.data_server", 8000),
        ServiceSpec("reward", "reward-server", "verl_grpo.services.reward_server", 8001),
        ServiceSpec("retrieval", "retrieval-server", "verl_grpo.services.retrieval_server", 8002),
        ServiceSpec("replay", "replay-buffer", "verl_grpo.services.replay_buffer", 8003),
    )
}
"""Config name (`services.enabled`) → spec; the SkyPilot job and rollout groups render their tasks from it.

The ports are those of SkyPilot's public examples (llm/verl-jobgroup: data 8000, reward 8001, retrieval 8002;
llm/rlhf-jobgroup: replay 8003). They are distinct because a local rehearsal resolves every task's host name to
127.0.0.1."""

DEFAULT_TOKEN_ENV = "VERL_GRPO_SERVICES_TOKEN"
TOKEN_ENV_NAME_ENV = "VERL_GRPO_SERVICES_TOKEN_ENV"
"""Names the env var the clients read the token from when services.token_env is not the default (the servers get
it as `--token-env`)."""


def client_token_env(env: Mapping[str, str] | None = None) -> str:
    """The env var the services' clients read the bearer token from: `$VERL_GRPO_SERVICES_TOKEN_ENV`, else
    VERL_GRPO_SERVICES_TOKEN."""
    return (env if env is not None else os.environ).get(TOKEN_ENV_NAME_ENV) or DEFAULT_TOKEN_ENV


def token_env_exports(token_env: str) -> dict[str, str]:
    """The env that points clients at services.token_env: {} for the default name."""
    return {} if token_env == DEFAULT_TOKEN_ENV else {TOKEN_ENV_NAME_ENV: token_env}


def token_file_env(token_env: str) -> str:
    """The env var naming a file that holds the token (`<token_env>_FILE`)."""
    return f"{token_env}_FILE"


__all__ = ["DEFAULT_TOKEN_ENV", "SERVICES", "TOKEN_ENV_NAME_ENV", "ServiceSpec", "client_token_env",
           "token_env_exports", "token_file_env"]
