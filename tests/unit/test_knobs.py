"""Every user knob (the env knobs and every `-o key=value`) rejects an empty, whitespace-only or unparseable value
with one line naming the knob, before anything runs; an unset env knob keeps the default."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from verl_grpo.config import ALL_KNOBS, ENV_KNOBS, RunConfig, load_config
from verl_grpo.config.loader import KNOB_ALSO_SETS
from verl_grpo.config.schema import accepts_empty
from verl_grpo.errors import ConfigError
from verl_grpo_cli.main import main


def _leaf_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _leaf_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


LEAF_KEYS = _leaf_keys()
NUMERIC_KNOBS = [var for var in ENV_KNOBS if var not in ("MODEL_NAME", "MODEL", "DATASET")]  # text knobs
VALID = {"DATASET": ("math", "math"), "MODEL_NAME": ("tiny", "tiny"), "MODEL": ("tiny", "tiny"),
         "TOTAL_STEPS": ("7", 7), "TOTAL_EPOCHS": ("2", 2), "TRAIN_BATCH_SIZE": ("3", 3), "BATCH_SIZE": ("2", 2),
         "WARMUP_STEPS": ("5", 5), "ROLLOUTS": ("6", 6), "CLIP_LOW": ("0.1", 0.1), "CLIP_HIGH": ("0.3", 0.3),
         "LR": ("1e-4", 1e-4), "ACTOR_LR": ("3e-6", 3e-6), "CRITIC_LR": ("2e-5", 2e-5), "TEMPERATURE": ("0.6", 0.6),
         "TOP_P": ("0.9", 0.9), "TOP_K": ("40", 40)}
NEEDS = {"CRITIC_LR": ["verl.adv_estimator=gae"]}
"""Overrides a knob needs to be valid (the critic's LR is only read by PPO with a critic)."""


def _error(**kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(**kwargs)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("value", ["", " ", "\t \n"])
@pytest.mark.parametrize("var", list(ENV_KNOBS))
def test_an_env_knob_set_to_nothing_is_one_line_naming_it(var, value):
    message = _error(env={var: value})
    assert message.startswith(f"env var {var}: empty value for {ENV_KNOBS[var]}") and f"unset {var}" in message


@pytest.mark.parametrize("value", ["abc", "1..2", "true", "[1"])
@pytest.mark.parametrize("var", NUMERIC_KNOBS)
def test_an_env_knob_that_does_not_parse_is_one_line_naming_it(var, value):
    message = _error(env={var: value})
    assert any(f"{key} (env var {var})" in message for key in (ENV_KNOBS[var], *KNOB_ALSO_SETS.get(var, ())))


@pytest.mark.parametrize("var", list(ENV_KNOBS))
def test_valid_env_knobs_still_apply_and_unset_ones_keep_the_default(var):
    raw, expected = VALID[var]
    flat = load_config([], NEEDS.get(var, []), env={var: raw}).flat()
    assert flat[ENV_KNOBS[var]] == expected
    defaults = load_config([], NEEDS.get(var, []), env={}).flat()
    assert all(flat[key] == defaults[key] for key in ENV_KNOBS.values() if key != ENV_KNOBS[var])


def test_every_seed_knob_is_read():
    assert set(ALL_KNOBS) == {"DATASET", "MODEL", "MODEL_NAME", "BATCH_SIZE", "GRAD_ACCUM", "WARMUP_STEPS",
                              "TOTAL_EPOCHS", "TOTAL_STEPS", "TRAIN_BATCH_SIZE", "ROLLOUTS", "LR", "ACTOR_LR",
                              "CRITIC_LR", "CLIP_LOW", "CLIP_HIGH", "TEMPERATURE", "TOP_P", "TOP_K", "USE_RETRIEVAL"}


def test_dataset_selects_the_dataset_profile():
    """DATASET=math with `-c gsm8k -c local` reads math.yaml in gsm8k.yaml's place (math's prompt lengths), and
    local.yaml still on top."""
    cfg = load_config(["gsm8k", "local"], env={"DATASET": "math"})
    assert cfg.dataset.name == "math" and cfg.algorithm.max_prompt_length == 1024
    assert cfg.algorithm.total_steps == 16  # local.yaml
    assert load_config(["gsm8k"], env={"DATASET": "mbpp"}).algorithm.train_batch_size == 16
    assert "unknown dataset 'svamp'; use one of gsm8k, math, mbpp, squad, nq_hotpotqa" in _error(files=["gsm8k"], env={"DATASET": "svamp"})


def test_batch_size_is_the_per_device_batch_of_both_backends():
    cfg = load_config([], env={"BATCH_SIZE": "2"})
    assert cfg.verl.micro_batch_size_per_gpu == 2 and cfg.trainer.micro_batch_size == 2


def test_grad_accum_times_batch_size_is_the_train_batch():
    """GRAIL's effective batch: data.train_batch_size = BATCH_SIZE × GRAD_ACCUM."""
    cfg = load_config([], env={"BATCH_SIZE": "2", "GRAD_ACCUM": "16"})
    assert cfg.algorithm.train_batch_size == 32 and cfg.verl.micro_batch_size_per_gpu == 2
    same = load_config([], env={"BATCH_SIZE": "2", "GRAD_ACCUM": "16", "TRAIN_BATCH_SIZE": "32"})
    assert same.algorithm.train_batch_size == 32


@pytest.mark.parametrize("env, names", [
    ({"MODEL": "Qwen/Qwen2.5-1.5B-Instruct", "MODEL_NAME": "Qwen/Qwen2.5-3B-Instruct"},
     ["MODEL='Qwen/Qwen2.5-1.5B-Instruct'", "MODEL_NAME='Qwen/Qwen2.5-3B-Instruct'", "unset MODEL"]),
    ({"ACTOR_LR": "1e-6", "LR": "3e-6"}, ["ACTOR_LR='1e-6'", "LR='3e-6'", "unset ACTOR_LR"]),
    ({"BATCH_SIZE": "2", "GRAD_ACCUM": "4", "TRAIN_BATCH_SIZE": "16"},
     ["BATCH_SIZE='2' × GRAD_ACCUM='4' = 8", "TRAIN_BATCH_SIZE='16'", "unset TRAIN_BATCH_SIZE or GRAD_ACCUM"]),
    ({"GRAD_ACCUM": "4"}, ["env var GRAD_ACCUM", "set BATCH_SIZE"]),
    ({"CRITIC_LR": "1e-5"}, ["env var CRITIC_LR", "verl.adv_estimator=gae", "unset CRITIC_LR"]),
])
def test_conflicting_knobs_are_one_error_naming_both_and_the_fix(env, names):
    message = _error(files=[], env=env)
    assert all(name in message for name in names), message


def test_two_names_of_one_knob_may_agree():
    assert load_config([], env={"MODEL": "tiny", "MODEL_NAME": "tiny"}).model.name == "tiny"
    assert load_config([], env={"ACTOR_LR": "1e-6", "LR": "0.000001"}).algorithm.lr == 1e-6


@pytest.mark.parametrize("var, value", [("GRAD_ACCUM", ""), ("GRAD_ACCUM", " "), ("GRAD_ACCUM", "0"),
                                        ("GRAD_ACCUM", "two"), ("GRAD_ACCUM", "1.5"), ("USE_RETRIEVAL", ""),
                                        ("USE_RETRIEVAL", "maybe"), ("USE_RETRIEVAL", "2")])
def test_derived_knobs_reject_bad_values_naming_them(var, value):
    message = _error(files=[], env={"BATCH_SIZE": "2", var: value})
    assert message.startswith(f"env var {var}: ") and f"unset {var}" in message


def test_use_retrieval_switches_the_retrieval_server():
    assert load_config([], env={"USE_RETRIEVAL": "true"}).services.enabled == ["retrieval"]
    both = load_config([], ["services.enabled=[reward]"], env={"USE_RETRIEVAL": "1"})
    assert both.services.enabled == ["reward"]  # -o comes after the env knobs
    f_cfg = load_config([], env={"USE_RETRIEVAL": "false"})
    assert f_cfg.services.enabled == []


def test_use_retrieval_false_removes_it_from_a_config_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("services: [reward, retrieval]\n")
    assert load_config([f], env={"USE_RETRIEVAL": "false"}).services.enabled == ["reward"]
    assert load_config([f], env={"USE_RETRIEVAL": "true"}).services.enabled == ["reward", "retrieval"]


def test_warmup_and_epochs_reach_both_backends(tmp_path):
    from verl_grpo.trainers.trl.backend import grpo_args
    from verl_grpo.trainers.verl.overrides import VerlPaths, verl_overrides

    cfg = load_config([], ["infra.accelerators=H100:1"], env={"WARMUP_STEPS": "3", "TOTAL_EPOCHS": "2",
                                                               "TOTAL_STEPS": "100", "TRAIN_BATCH_SIZE": "8"})
    ov = verl_overrides(cfg, {"train": "t", "val": "v"}, VerlPaths("/c"), "r", env={})
    assert "actor_rollout_ref.actor.optim.lr_warmup_steps=3" in ov and "trainer.total_epochs=2" in ov
    assert "trainer.total_training_steps=100" in ov  # verl stops at whichever comes first
    assert cfg.algorithm.planned_steps(40) == 10 and cfg.algorithm.planned_steps(4000) == 100
    assert cfg.algorithm.planned_steps(None) == 100
    args = grpo_args(cfg, tmp_path, use_cpu=True, total_steps=cfg.algorithm.planned_steps(40))
    assert args.warmup_steps == 3 and args.lr_scheduler_type == "constant_with_warmup" and args.max_steps == 10


def test_the_cpu_profile_keeps_its_measured_sampling_and_cluster_configs_follow_the_seeds():
    for dataset in ("gsm8k", "math", "mbpp"):
        local = load_config([dataset, "local"], env={}).algorithm
        assert (local.temperature, local.top_p, local.top_k, local.warmup_steps) == (1.0, 1.0, -1, 0)
        cluster = load_config([dataset], env={}).algorithm
        assert (cluster.temperature, cluster.top_p, cluster.top_k) == (0.7, 0.95, 50)


def test_a_model_name_is_the_text_given():
    """YAML would read these as a number, a boolean and None; a model name or path is text."""
    for name in ("123", "on", "1e-4", "org/model:v2"):
        assert load_config([], env={"MODEL_NAME": name}).model.name == name
        assert load_config([], [f"model.name={name}"], env={}).model.name == name


@pytest.mark.parametrize("value", ["", "   "])
@pytest.mark.parametrize("key", [k for k in LEAF_KEYS if k != "dataset.system_prompt"])
def test_every_override_rejects_an_empty_value_naming_the_key(key, value):
    message = _error(overrides=[f"{key}={value}"], env={})
    assert message.startswith(f"override '{key}={value}': empty value for {key}")


def test_the_one_field_that_accepts_empty_is_the_system_prompt():
    """`-o dataset.system_prompt=` sends no system message (None would mean the dataset's default prompt)."""
    assert [k for k in LEAF_KEYS if accepts_empty(_field_info(k))] == ["dataset.system_prompt"]
    assert load_config([], ["dataset.system_prompt="], env={}).dataset.system_prompt == ""
    assert load_config([], ["dataset.system_prompt=null"], env={}).dataset.system_prompt is None


def _field_info(key: str):
    model, info = RunConfig, None
    for part in key.split("."):
        info = model.model_fields[part]
        model = info.annotation
    return info


def test_an_optional_field_is_unset_with_null_not_with_nothing():
    assert "`null` sets it to None" in _error(overrides=["trainer.threads="], env={})
    assert load_config([], ["trainer.threads=null"], env={}).trainer.threads is None


@pytest.mark.parametrize("override, names", [
    ("algorithm.rollouts=four", "algorithm.rollouts (override 'algorithm.rollouts=four')"),
    ("algorithm.total_steps=false", "algorithm.total_steps (override 'algorithm.total_steps=false')"),
    ("eval.limit=[1", "eval.limit (override 'eval.limit=[1')"),
    ("storage.keep_last=2.5", "storage.keep_last (override 'storage.keep_last=2.5')"),
    ("storage.uri=file://relative/store", "storage.uri (override 'storage.uri=file://relative/store')"),
    ("tracking.mlflow_uri=sqlite:///mlflow.db", "tracking.mlflow_uri (override 'tracking.mlflow_uri=sqlite:///mlflow"),
])
def test_an_override_that_does_not_parse_names_it(override, names):
    assert names in _error(overrides=[override], env={})


def test_a_blank_value_in_a_config_file_names_the_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text('model:\n  name: "  "\n')
    assert _error(files=[f], env={}).startswith("invalid config: model.name: must not be empty")


def test_local_uris_get_home_expanded():
    cfg = load_config([], ["storage.uri=file://~/somewhere/store", "tracking.mlflow_uri=sqlite:///~/m/mlflow.db"],
                      env={})
    assert cfg.storage.uri.startswith("file:///") and cfg.storage.uri.endswith("/somewhere/store")
    assert cfg.tracking.mlflow_uri.startswith("sqlite:////") and cfg.tracking.mlflow_uri.endswith("/m/mlflow.db")


@pytest.mark.parametrize("args", [["-o", "model.name="], ["-o", "algorithm.lr= "], ["-o", "algorithm.rollouts=x"]])
def test_the_cli_prints_one_line_and_exits_2(args, monkeypatch):
    result = CliRunner(mix_stderr=False).invoke(main, ["validate", "-c", "gsm8k", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error (ConfigError): ") and result.stderr.count("\n") == 1, result.stderr


def test_the_cli_names_an_empty_env_knob(monkeypatch):
    monkeypatch.setenv("TOP_K", "")
    result = CliRunner(mix_stderr=False).invoke(main, ["validate", "-c", "gsm8k"])
    assert result.exit_code == 2
    assert result.stderr == "error (ConfigError): env var TOP_K: empty value for algorithm.top_k; give a value or " \
                            "unset TOP_K to use the default\n"
