"""Fair champions against a real MLflow (SQLite): only a version of the champion's base model and dataset competes."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from registry_runs import correct_first, make_env, make_run, register, with_model

from verl_grpo.registry import champion_needs_reeval, list_models

NAME = "verl-grpo-gsm8k"


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path)


def tiny_in_line(cfg):
    """A tiny run registered under the SmolLM2 line's name (by default a tiny run has a name of its own)."""
    return with_model(cfg, "tiny", registered_model=NAME)


def _champion(cfg, name=NAME) -> str:
    return str(MlflowClient(cfg.tracking.mlflow_uri).get_model_version_by_alias(name, "champion").version)


def test_a_tiny_run_never_displaces_the_smollm2_champion_but_a_comparable_better_run_does(env, tiny_model_dir):
    cfg, store, dataset = env  # the default base model: smollm2-135m
    tiny = tiny_in_line(cfg)
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "smol-weak", correct_first(10)))

    far_better = register(tiny, store, dataset, *make_run(store, tiny_model_dir, "tiny-strong", correct_first(38)))

    assert far_better.decision == (
        "not promoted: champion v1 was trained from smollm2-135m on gsm8k, v2 from tiny on gsm8k; "
        "register under tracking.registered_model=verl-grpo-gsm8k-tiny to keep lines apart")
    assert far_better.aliases == [] and _champion(cfg) == "1"  # not even the line's challenger
    client = MlflowClient(cfg.tracking.mlflow_uri)
    v2 = client.get_model_version(NAME, "2")
    assert v2.tags["promotion.decision"] == "kept-other-line"
    assert v2.tags["comparability"] == "dataset=gsm8k base=tiny"
    assert not [k for k in client.get_run(v2.run_id).data.metrics if k.startswith("promotion/")]  # never compared

    # Another spelling of SmolLM2 is the same line: compared with v1 (not with the better tiny v2), and promoted.
    smol = with_model(cfg, "HuggingFaceTB/SmolLM2-135M-Instruct")
    better = register(smol, store, dataset, *make_run(store, tiny_model_dir, "smol-strong", correct_first(30)))
    assert better.decision.startswith("promoted v3 over v1 (accuracy 0.750 vs 0.250")
    assert _champion(cfg) == "3"


def test_a_smollm2_run_never_displaces_a_tiny_champion(env, tiny_model_dir):
    cfg, store, dataset = env
    first = register(tiny_in_line(cfg), store, dataset,
                     *make_run(store, tiny_model_dir, "t", correct_first(5)))
    assert "champion" in first.aliases  # the first model sets the line of the registered model

    smol = register(cfg, store, dataset, *make_run(store, tiny_model_dir, "s", correct_first(38)))

    assert smol.decision.startswith("not promoted: champion v1 was trained from tiny on gsm8k, v2 from smollm2-135m")
    assert smol.decision.endswith("register under tracking.registered_model=verl-grpo-gsm8k-smollm2-135m to keep "
                                  "lines apart")
    assert _champion(cfg) == "1"


def test_registered_under_its_own_name_a_tiny_run_is_champion_there_and_the_smollm2_line_is_untouched(
        env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "smol", correct_first(10)))

    own = with_model(cfg, "tiny")  # a smoke run: its own registered model unless tracking.registered_model says
    assert own.registered_model_name == "verl-grpo-gsm8k-tiny"
    version = register(own, store, dataset, *make_run(store, tiny_model_dir, "tiny", correct_first(38)))

    assert (version.name, version.version, version.aliases) == ("verl-grpo-gsm8k-tiny", "1", ["champion"])
    assert _champion(cfg) == "1" and [r["version"] for r in list_models(cfg)] == [1]


def test_a_champion_of_another_line_is_not_re_evaluated(env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "smol", correct_first(10), settings="old"))
    _, tiny_report, _ = make_run(store, tiny_model_dir, "tiny", correct_first(10), settings="new")
    _, smol_report, _ = make_run(store, tiny_model_dir, "smol2", correct_first(10), settings="new")

    assert champion_needs_reeval(cfg, smol_report)  # same line, other eval settings: reconciled by re-evaluation
    assert not champion_needs_reeval(tiny_in_line(cfg), tiny_report)  # other line: never compared


def test_a_champion_registered_before_lines_existed_gets_its_line_from_its_run(env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "old", correct_first(10)))
    client = MlflowClient(cfg.tracking.mlflow_uri)
    client.delete_model_version_tag(NAME, "1", "comparability")  # as registered by the earlier code

    kept = register(tiny_in_line(cfg), store, dataset, *make_run(store, tiny_model_dir, "t", correct_first(38)))
    promoted = register(cfg, store, dataset, *make_run(store, tiny_model_dir, "new", correct_first(30)))

    assert kept.decision.startswith("not promoted: champion v1 was trained from smollm2-135m on gsm8k, v2 from tiny")
    assert promoted.decision.startswith("promoted v3 over v1")


def test_versions_list_their_base_model_and_every_eval_metric_from_their_run(env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "smol", correct_first(10)))
    register(tiny_in_line(cfg), store, dataset, *make_run(store, tiny_model_dir, "tiny", correct_first(20)))

    rows = list_models(cfg)

    assert [(r["version"], r["base_model"], r["decision"]) for r in rows] == [
        (2, "tiny", "kept-other-line"), (1, "smollm2-135m", "first-model")]
    assert rows[0]["eval"] == {"accuracy": 0.5, "n": 40.0, "pass_at_4": 0.5}
    assert rows[0]["comparability"] == "dataset=gsm8k base=tiny"
