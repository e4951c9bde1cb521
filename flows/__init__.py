"""Prefect flows of verl-grpo."""
