"""The `verl-grpo` command line (cli.main), over the domain package and the Prefect flow."""
