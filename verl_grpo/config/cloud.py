"""What a run on SkyPilot implies, shared by `verl-grpo launch --provider skypilot` and the nightly GPU deployments
(prefect.yaml, flows/deploy_steps.py)."""

from __future__ import annotations

SKYPILOT_IMPLIES: tuple[str, ...] = ("trainer.backend=verl", "warm_start.enabled=false")
"""Overrides put before the user's own: verl trains on the GPUs, and verl has no warm start phase (yet)."""
