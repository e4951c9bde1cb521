"""Providers, by `infra.provider` name. A new cloud is one new module and one line here."""

from __future__ import annotations

from verl_grpo.plugins import load_named
from verl_grpo.providers.base import Provider, follow_job

__all__ = ["PROVIDERS", "Provider", "follow_job", "get_provider"]

PROVIDERS: dict[str, str] = {
    "local": "verl_grpo.providers.local:LocalProvider",
    "skypilot": "verl_grpo.providers.skypilot:SkyPilotProvider",
}


def get_provider(name: str) -> Provider:
    """The Provider registered as `name`, or ConfigError naming `infra.provider`."""
    return load_named("infra.provider", PROVIDERS, name)()
