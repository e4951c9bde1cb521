"""Prefect tasks: each wraps exactly one step of verl_grpo.plain_steps; retries and caching are declared here."""
