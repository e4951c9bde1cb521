"""Refuse anything secret-looking before it reaches MLflow params or tags (they are visible to every reader)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from verl_grpo.errors import ConfigError

_SECRET_WORDS = {"token", "secret", "password", "passwd", "apikey", "credential", "credentials", "auth"}
# `key` alone is too common (settings_key, cache_key); these are the credential kinds of key.
_SECRET_KEY_NAME = re.compile(r"(^|[_-])(api|access|private|secret|ssh|signing|encryption|account|client)[_-]?key$")
_SECRET_VALUES = [
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),  # Hugging Face token
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"://[^/\s:@]+:[^/\s@]+@"),  # credentials inside a URL
]


def is_secret_key(key: str) -> bool:
    """True when a (dotted) key names a credential: its last segment has a word like token/secret/password,
    or is a credential kind of key (`key`, `api_key`, `aws_secret_access_key`; not `settings_key`).
    Keys that point at a secret (`token_env`, `token_file`) are not secrets; their values are still checked."""
    last = key.rsplit(".", 1)[-1].lower()
    if last.endswith(("_env", "_env_var", "_file")):
        return False  # names where the secret lives (an env var, a secret file), not the secret itself
    if any(word in _SECRET_WORDS for word in re.split(r"[_\-\s]+", last)):
        return True
    return last == "key" or bool(_SECRET_KEY_NAME.search(last))


def assert_no_secrets(values: Mapping[str, Any], where: str) -> None:
    """ConfigError when a secret-named key has a non-empty value, or a value looks like a credential."""
    for key, value in values.items():
        if value is None or value == "":
            continue
        if is_secret_key(key):
            raise ConfigError(f"{where}: {key!r} looks like a secret and would be visible in MLflow; secrets belong "
                              "in the environment (AWS_*, HF_TOKEN, WANDB_API_KEY), not in config or tags")
        text = str(value)
        if any(p.search(text) for p in _SECRET_VALUES):
            raise ConfigError(f"{where}: the value of {key!r} looks like a credential; remove it and pass secrets "
                              "through the environment")
