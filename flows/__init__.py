"""Prefect flows of verl-grpo."""

from verl_grpo.privacy import apply_quiet_env

# A flow-run process a worker starts imports this package first: the libraries the flow imports see it.
apply_quiet_env()
