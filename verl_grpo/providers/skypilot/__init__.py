"""SkyPilot provider: managed spot jobs and job groups for verl on GPU clusters (see provider.py)."""

from verl_grpo.providers.skypilot.provider import SkyPilotProvider

__all__ = ["SkyPilotProvider"]
