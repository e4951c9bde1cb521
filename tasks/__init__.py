"""Prefect tasks: each wraps exactly one step of verl_grpo.pipeline; retries and caching are declared here."""
