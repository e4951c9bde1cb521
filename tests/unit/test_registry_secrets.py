import pytest

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError
from verl_grpo.registry.secrets import assert_no_secrets, is_secret_key
from verl_grpo.registry.tracking import metric_name, single_values, value_name


@pytest.mark.parametrize("key", ["hf_token", "x.wandb_api_key", "aws_secret_access_key", "password", "key",
                                 "github-token", "db.credentials", "access_key"])
def test_credential_names_are_secret(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["eval.settings_key", "eval.max_new_tokens", "storage.keep_last", "algorithm.top_k",
                                 "model_key", "tokenizer"])
def test_ordinary_names_are_not(key):
    assert not is_secret_key(key)


def test_no_config_field_looks_secret():
    fields = RunConfig().flat()
    assert [key for key in fields if is_secret_key(key)] == []
    assert_no_secrets(fields, "config")


def test_secret_names_with_values_are_refused_and_empty_ones_allowed():
    assert_no_secrets({"hf_token": "", "api_key": None}, "tags")
    with pytest.raises(ConfigError, match="'hf_token' looks like a secret"):
        assert_no_secrets({"hf_token": "abc"}, "tags")


@pytest.mark.parametrize("value", ["AKIAABCDEFGHIJKLMNOP", "hf_" + "a" * 34, "s3://user:pw@host/bucket"])
def test_credential_looking_values_are_refused(value):
    with pytest.raises(ConfigError, match="looks like a credential"):
        assert_no_secrets({"note": value}, "tags")


def test_metric_names_are_made_valid_for_mlflow():
    assert metric_name("eval/pass@4") == "eval/pass_at_4"
    assert metric_name("reward/strict_format") == "reward/strict_format"
    assert metric_name("a(b)") == "a_b_"


def test_single_values_are_named_without_a_slash_and_old_names_still_read():
    assert value_name("eval", "reward/correctness") == "eval.reward.correctness"
    assert value_name("pvalue", "trained_vs_base", "accuracy") == "pvalue.trained_vs_base.accuracy"
    old = {"eval/accuracy": 0.5, "promotion/mcnemar_p": 0.01, "train/final_step": 3.0, "train/loss": 0.2}
    assert single_values(old) == {**old, "eval.accuracy": 0.5, "promotion.mcnemar_p": 0.01, "train.final_step": 3.0}
    assert single_values({"eval.accuracy": 0.7, "eval/accuracy": 0.5})["eval.accuracy"] == 0.7  # the new name wins


def test_pointers_to_secrets_are_not_secrets():
    from verl_grpo.registry.secrets import assert_no_secrets, is_secret_key

    assert not is_secret_key("services.token_env") and not is_secret_key("services.token_file")
    assert_no_secrets({"services.token_env": "VERL_GRPO_SERVICE_TOKEN"}, "params")
    with pytest.raises(ConfigError):
        assert_no_secrets({"services.token_env": "hf_" + "a" * 34}, "params")
