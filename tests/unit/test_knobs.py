"""Every user knob (the env knobs and every `-o key=value`) rejects an empty, whitespace-only or unparseable value
with one line naming the knob, before anything runs; an unset env knob keeps the default."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from cli.main import main
from verl_grpo.config import ENV_KNOBS, RunConfig, load_config
from verl_grpo.config.schema import accepts_empty
from verl_grpo.errors import ConfigError


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
NUMERIC_KNOBS = [var for var in ENV_KNOBS if var != "MODEL_NAME"]  # any text is a model name or path
VALID = {"MODEL_NAME": ("tiny", "tiny"), "TOTAL_STEPS": ("7", 7), "TRAIN_BATCH_SIZE": ("3", 3), "ROLLOUTS": ("6", 6),
         "CLIP_LOW": ("0.1", 0.1), "CLIP_HIGH": ("0.3", 0.3), "LR": ("1e-4", 1e-4), "TEMPERATURE": ("0.7", 0.7),
         "TOP_P": ("0.9", 0.9), "TOP_K": ("50", 50)}


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
    assert f"{ENV_KNOBS[var]} (env var {var})" in message


@pytest.mark.parametrize("var", list(ENV_KNOBS))
def test_valid_env_knobs_still_apply_and_unset_ones_keep_the_default(var):
    raw, expected = VALID[var]
    flat = load_config([], env={var: raw}).flat()
    assert flat[ENV_KNOBS[var]] == expected
    defaults = load_config([], env={}).flat()
    assert all(flat[key] == defaults[key] for key in ENV_KNOBS.values() if key != ENV_KNOBS[var])


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
