"""W&B mirror: the run's training curves and eval summary, when WANDB_API_KEY (or WANDB_MODE=offline) is set.

wandb reads the key from the environment; we only check its shape (wandb's own rule) and, where the server answers,
the login. The key's value never enters a message, log, parameter or artifact of ours.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Literal

from verl_grpo.errors import ConfigError
from verl_grpo.extras import require
from verl_grpo.mirrors.base import MirrorFailed, Readiness, RunMetrics

API_KEY_ENV, BASE_URL_ENV, MODE_ENV = "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE"
DEFAULT_BASE_URL = "https://api.wandb.ai"
"""wandb.Settings.base_url's default."""
OFFLINE_MODES = ("offline", "dryrun")
QUIET_ENV = {"WANDB_ERROR_REPORTING": "false"}
"""wandb.env.ERROR_REPORTING off: no Sentry reports from the SDK (wandb.analytics.sentry) and wandb-core started
with `--no-observability` (wandb.sdk.lib.service.service_process). Set in every process of ours that may import
wandb: this one before its import, and verl's training processes through their TrainSpec env."""
LOGIN_TIMEOUT_S = 5.0
VIEWER_QUERY = "query { viewer { id } }"
"""What wandb's own login check (`wandb.login(verify=True)`, InternalApi.validate_api_key) asks the server."""
KEY_FIX = ("set it to your API key from https://wandb.ai/authorize, or unset it to train without the W&B mirror "
           "(MLflow records the run either way)")


def quiet_wandb(environ: MutableMapping[str, str] | None = None) -> None:
    """wandb's own error reporting off in this process (call before `import wandb`) or in a child's env."""
    (os.environ if environ is None else environ).update(QUIET_ENV)


def wandb_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    mode = env.get(MODE_ENV, "")
    return mode != "disabled" and (bool(env.get(API_KEY_ENV)) or mode in OFFLINE_MODES)


def base_url(env: Mapping[str, str]) -> str:
    return (env.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")


def key_problem(key: str) -> str | None:
    """wandb's own shape rule for API keys (wandb.sdk.lib.wbauth.validation.check_api_key): a sentence, or None."""
    quiet_wandb()
    from wandb.sdk.lib.wbauth.validation import check_api_key

    return check_api_key(key)


def require_key_shape(env: Mapping[str, str]) -> None:
    """ConfigError naming WANDB_API_KEY when it is set and not shaped like a W&B key (no network call)."""
    key = env.get(API_KEY_ENV, "")
    if key and (problem := key_problem(key)):
        raise ConfigError(f"{API_KEY_ENV} is not a W&B API key ({problem}); {KEY_FIX}")


@dataclass(frozen=True)
class Login:
    status: Literal["ok", "rejected", "unreachable"]
    detail: str


def check_login(key: str, url: str, timeout: float = LOGIN_TIMEOUT_S) -> Login:
    """wandb's login check, asked once with a short timeout instead of through wandb's retry loop (which keeps
    retrying a refused connection for minutes); a hard deadline also covers a DNS lookup that hangs."""
    import requests

    answer: dict[str, object] = {}

    def ask() -> None:
        try:
            answer["response"] = requests.post(f"{url}/graphql", json={"query": VIEWER_QUERY}, auth=("api", key),
                                               timeout=timeout)
        except requests.RequestException as e:
            answer["error"] = e

    thread = threading.Thread(target=ask, name="wandb-login-check", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    response = answer.get("response")
    if not isinstance(response, requests.Response):
        error = answer.get("error")
        return Login("unreachable", f"{url} could not be reached "
                                    f"({_why(error) if error else f'no answer in {timeout:g} s'})")
    if response.status_code in (401, 403):
        return Login("rejected", f"{url} rejected it (HTTP {response.status_code})")
    if response.status_code != 200:
        return Login("unreachable", f"{url} answered HTTP {response.status_code}")
    try:
        viewer = (response.json().get("data") or {}).get("viewer")
    except (ValueError, AttributeError):
        return Login("unreachable", f"{url} did not answer like a W&B server")
    return Login("ok", f"login verified at {url}") if viewer else Login("rejected", f"{url} knows no user for it")


def _why(error: object) -> str:
    """`Connection refused`, `Name or service not known`, `timed out`: the cause, not urllib3's paragraph."""
    text = str(error)
    if errno := re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text):
        return errno.group(1).strip()
    return "timed out" if "timed out" in text.lower() else type(error).__name__


class WandbMirror:
    name = "wandb"
    secret_env = (API_KEY_ENV,)

    def enabled(self, env: Mapping[str, str]) -> bool:
        return wandb_enabled(env)

    def preflight(self, env: Mapping[str, str]) -> Readiness:
        require("wandb", f"the W&B mirror ({API_KEY_ENV} or {MODE_ENV}=offline set)")
        key = env.get(API_KEY_ENV, "")
        require_key_shape(env)
        if env.get(MODE_ENV, "") in OFFLINE_MODES:
            return Readiness(f"offline ({MODE_ENV}={env[MODE_ENV]}): runs are written locally, nothing is sent")
        login = check_login(key, base_url(env))
        if login.status == "rejected":
            raise ConfigError(f"{API_KEY_ENV} was not accepted: {login.detail}; {KEY_FIX}")
        if login.status == "unreachable":
            return Readiness(f"W&B login could not be checked: {login.detail}; going on, the mirror is tried after "
                             "registration", warning=True)
        return Readiness(f"key well-formed, {login.detail}")

    def send(self, run: RunMetrics) -> str:
        if os.environ.get(MODE_ENV, "") not in OFFLINE_MODES:
            key = os.environ.get(API_KEY_ENV, "")
            if problem := key_problem(key):
                raise MirrorFailed(f"{API_KEY_ENV} is not a W&B API key ({problem})")
            # Checked first because wandb.init would retry an unreachable server for minutes.
            if (login := check_login(key, base_url(os.environ))).status != "ok":
                raise MirrorFailed(f"W&B login failed: {login.detail}")
        return mirror_to_wandb(run)


def mirror_to_wandb(run: RunMetrics) -> str:
    """Log the run's training curves and eval summary to W&B (project `verl-grpo-<dataset>`, W&B run id = run_id,
    resumed on a retry so nothing is logged twice over). Returns the W&B run URL, or the offline run dir."""
    quiet_wandb()
    import wandb

    settings = wandb.Settings(silent=True, init_timeout=60)
    wb = wandb.init(project=run.cfg.wandb_project, id=run.run_id, name=run.run_id, resume="allow",
                    config=run.cfg.params(), reinit="finish_previous", settings=settings)
    try:
        for line in run.metrics_lines:
            if line.strip():
                record = json.loads(line)
                step = int(record.pop("step"))
                numbers = {f"train/{k}": v for k, v in record.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)}
                wb.log(numbers, step=step)
        wb.summary.update(dict(run.summary))
        return wb.url or wb.dir
    finally:
        wb.finish()
