"""The `verl-grpo` command line (verl_grpo_cli.main), over the domain package and the Prefect flow."""

from verl_grpo.privacy import apply_quiet_env

apply_quiet_env()  # before any library is imported: most read their telemetry switch then
