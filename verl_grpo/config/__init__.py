"""Typed run configuration: YAML files + environment knobs + dotted overrides → one validated RunConfig.

Precedence, lowest first: field defaults, each `-c FILE` in order, the env vars users know
(MODEL_NAME, TOTAL_STEPS, ...; ALL_KNOBS), then `-o dotted.key=value` overrides. Unknown keys fail with the
nearest valid name. Secrets never live here: they are read from the environment where used.
"""

from verl_grpo.config.loader import ALL_KNOBS, DEFAULT_PROFILES, ENV_KNOBS, config_files, load_config
from verl_grpo.config.schema import AlgorithmConfig, DatasetConfig, OrchestrationConfig, RunConfig, StorageConfig

__all__ = [
    "ALL_KNOBS", "DEFAULT_PROFILES", "ENV_KNOBS", "AlgorithmConfig", "DatasetConfig", "OrchestrationConfig",
    "RunConfig", "StorageConfig", "config_files", "load_config",
]
