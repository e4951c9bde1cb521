"""A user's environment for a child process: none of the switches the product sets itself (`QUIET_ENV`), no CI or
pytest markers (MLflow and Prefect stay quiet in CI on their own, which would hide a missing switch), and no
Prefect, MLflow, W&B or HF settings of the test run."""

from __future__ import annotations

import os

from verl_grpo.privacy import QUIET_ENV

# Variables by which MLflow or Prefect detect a CI or test run and switch their telemetry off by themselves.
CI_MARKERS = {"CI", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "JENKINS_URL", "TRAVIS", "TF_BUILD", "BUILDKITE",
              "BITBUCKET_BUILD_NUMBER", "BITBUCKET_COMMIT", "CODEBUILD_BUILD_ARN", "CODEBUILD_BUILD_ID",
              "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION", "DRONE", "SEMAPHORE", "APPVEYOR", "BUDDY", "CI_NAME",
              "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID"}
TEST_RUN_PREFIXES = ("PREFECT_", "PYTEST_", "VERL_GRPO_", "MLFLOW_", "WANDB_", "HF_")


def user_env(**values: str) -> dict[str, str]:
    """This process's environment as a user's shell would have it, plus `values`."""
    drop = set(QUIET_ENV) | CI_MARKERS
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(TEST_RUN_PREFIXES)}
    return {**env, **values}
