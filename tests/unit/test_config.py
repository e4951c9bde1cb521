"""Config loading: files, env knobs, overrides, unknown keys, validation messages, digest."""

from __future__ import annotations

import pytest
import yaml

from verl_grpo.config import ENV_KNOBS, RunConfig, load_config
from verl_grpo.errors import ConfigError


def test_shipped_profiles_load_and_merge_in_order():
    cfg = load_config(["gsm8k", "local"], env={})
    assert cfg.dataset.name == "gsm8k"
    assert cfg.algorithm.rollouts == 4  # local overrides gsm8k's 8
    assert cfg.algorithm.clip_low == 0.2 and cfg.algorithm.clip_high == 0.28
    for name in ("math", "mbpp"):
        assert load_config([name], env={}).dataset.name == name


def test_a_files_by_dataset_settings_apply_to_that_dataset_only_wherever_the_dataset_is_named(tmp_path):
    f = tmp_path / "cpu.yaml"
    f.write_text("warm_start:\n  steps: 40\nby_dataset:\n  squad:\n    warm_start:\n      steps: 16\n"
                 "  mbpp:\n    trainer:\n      logging_steps: 3\n")
    assert load_config(["squad", f], env={}).warm_start.steps == 16
    assert load_config(["gsm8k", f], env={}).warm_start.steps == 40
    assert load_config([f, "mbpp"], env={}).trainer.logging_steps == 3  # the run's dataset, not the one read so far
    assert load_config(["gsm8k", f], ["dataset.name=squad"], env={}).warm_start.steps == 16
    assert load_config(["gsm8k", f], env={"DATASET": "squad"}).warm_start.steps == 16
    # ... and below the later files, env knobs and overrides, like the rest of the file
    assert load_config(["squad", f], ["warm_start.steps=5"], env={}).warm_start.steps == 5
    later = tmp_path / "later.yaml"
    later.write_text("warm_start:\n  steps: 7\n")
    assert load_config(["squad", f, later], env={}).warm_start.steps == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("by_dataset:\n  squadd:\n    warm_start:\n      steps: 1\n")
    with pytest.raises(ConfigError, match="by_dataset.squadd names no dataset; use one of gsm8k, math"):
        load_config(["gsm8k", bad], env={})
    bad.write_text("by_dataset:\n  squad:\n    warm_start:\n      step: 1\n")  # checked even when unused
    with pytest.raises(ConfigError, match="unknown key 'by_dataset.squad.warm_start.step'; did you mean"):
        load_config(["gsm8k", bad], env={})


def test_precedence_file_then_env_then_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algorithm:\n  rollouts: 6\n  lr: 0.001\n")
    cfg = load_config([f], ["algorithm.lr=0.5"], env={"ROLLOUTS": "12", "LR": "0.01", "MODEL_NAME": "tiny"})
    assert cfg.algorithm.rollouts == 12
    assert cfg.algorithm.lr == 0.5
    assert cfg.model.name == "tiny"


def test_every_env_knob_maps_to_a_real_field():
    values = {"DATASET": "math", "MODEL_NAME": "tiny", "MODEL": "tiny", "TOTAL_STEPS": "3", "TOTAL_EPOCHS": "2",
              "TRAIN_BATCH_SIZE": "5", "BATCH_SIZE": "5", "WARMUP_STEPS": "1", "ROLLOUTS": "3", "CLIP_LOW": "0.1",
              "CLIP_HIGH": "0.3", "LR": "2e-5", "ACTOR_LR": "2e-5", "CRITIC_LR": "3e-5", "TEMPERATURE": "0.7",
              "TOP_P": "0.9", "TOP_K": "20"}
    assert set(values) == set(ENV_KNOBS)
    flat = load_config([], ["verl.adv_estimator=gae"], env=values).flat()
    assert flat["algorithm.total_steps"] == 3 and flat["algorithm.top_k"] == 20 and flat["algorithm.lr"] == 2e-5
    assert flat["verl.critic_lr"] == 3e-5 and flat["dataset.name"] == "math" and flat["algorithm.total_epochs"] == 2


def test_unknown_override_names_nearest_key():
    with pytest.raises(ConfigError, match="did you mean 'algorithm.rollouts'"):
        load_config(["gsm8k"], ["algorithm.rolouts=8"], env={})


def test_unknown_file_key_names_nearest_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algorithm:\n  clip_hgh: 0.3\n")
    with pytest.raises(ConfigError, match="did you mean 'algorithm.clip_high'"):
        load_config([f], env={})
    f.write_text("algorthm:\n  rollouts: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'algorithm'"):
        load_config([f], env={})


def test_bad_values_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.rollouts"):
        load_config([], ["algorithm.rollouts=1"], env={})
    with pytest.raises(ConfigError, match="clip_high"):
        load_config([], ["algorithm.clip_high=0.1"], env={})
    with pytest.raises(ConfigError, match="storage.uri"):
        load_config([], ["storage.uri=/no/scheme"], env={})
    with pytest.raises(ConfigError, match="dataset.name"):
        load_config([], ["dataset.name=cifar"], env={})
    with pytest.raises(ConfigError, match="algorithm.lr"):
        load_config([], env={"LR": "fast"})


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config([], ["algorithm.rollouts"], env={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(["no-such-profile"], env={})
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config([], ["algorithm.rollouts.x=1"], env={})


def test_digest_is_stable_and_sensitive():
    a, b = load_config(["gsm8k"], env={}), load_config(["gsm8k"], env={})
    assert a.digest() == b.digest()
    assert load_config(["gsm8k"], ["algorithm.lr=1e-5"], env={}).digest() != a.digest()


def test_resolved_yaml_roundtrips():
    cfg = load_config(["mbpp", "local"], env={})
    assert RunConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg


def test_every_field_has_a_docstring():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            sub = field.annotation
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                walk(sub)

    walk(RunConfig)


def test_names_derive_from_dataset():
    cfg = load_config(["math"], env={})
    assert cfg.experiment_name == "verl-grpo/math"
    assert cfg.registered_model_name == "verl-grpo-math"


def test_how_work_is_spread_does_not_change_the_run():
    a = load_config(["gsm8k"], env={})
    b = load_config(["gsm8k"], ["eval.shards=2", "orchestration.task_runner=ray"], env={})
    assert a.digest() == b.digest()


def test_params_leave_out_the_sections_another_backend_provider_or_unrun_service_reads():
    def sections(overrides: list[str]) -> set[str]:
        return {".".join(k.split(".")[:2]) if k.startswith("services.") else k.split(".")[0]
                for k in load_config([], overrides, env={}).params()}

    local_trl = sections([])
    assert {"algorithm", "trainer", "infra", "eval"} <= local_trl
    assert not local_trl & {"verl", "skypilot"} and not any(s.startswith("services") for s in local_trl)
    assert {"verl", "skypilot"} <= sections(["trainer.backend=verl", "infra.provider=skypilot",
                                             "infra.accelerators=H100:8"])
    with_reward = sections(["services=[reward]"])
    assert {"services.enabled", "services.reward"} <= with_reward and "services.retrieval" not in with_reward
    cfg = load_config([], ["trainer.backend=verl"], env={})
    assert cfg.params().keys() < cfg.flat().keys()  # every param is a setting of the full view


def test_the_local_profile_warm_starts_and_verl_refuses_it_in_one_line():
    cfg = load_config(["gsm8k", "local"], env={})
    assert cfg.warm_start.enabled and "warm_start.steps" in cfg.params()
    assert "warm_start.steps" not in load_config(["gsm8k"], env={}).params()
    with pytest.raises(ConfigError) as raised:
        load_config(["gsm8k", "local"], ["trainer.backend=verl"], env={})
    message = str(raised.value)
    assert "warm_start.enabled=false" in message and "'dataset'" not in message  # no config dump
    assert not load_config(["gsm8k", "local"], ["trainer.backend=verl", "warm_start.enabled=false"],
                           env={}).warm_start.enabled


def test_service_resources_default_to_the_seeds_and_are_validated():
    s = load_config(["gsm8k"], env={}).services
    assert (s.data.cpus, s.data.memory, s.reward.cpus, s.reward.memory) == ("4+", "16+", "4+", "8+")
    assert (s.retrieval.cpus, s.retrieval.memory, s.retrieval.replicas) == ("16+", "64+", 1)
    assert (s.replay.cpus, s.replay.memory, s.reward.accelerators) == ("4+", "16+", "L4:1")
    cfg = load_config(["gsm8k"], ["services.retrieval.cpus=8", "services.retrieval.memory=32+",
                                  "services.retrieval.replicas=2"], env={})
    assert (cfg.services.retrieval.cpus, cfg.services.retrieval.memory) == ("8", "32+")
    with pytest.raises(ConfigError, match=r"services.retrieval.cpus.*'lots' is no amount of vCPUs"):
        load_config(["gsm8k"], ["services.retrieval.cpus=lots"], env={})
    with pytest.raises(ConfigError, match=r"services.reward.accelerators.*NAME:COUNT"):
        load_config(["gsm8k"], ["services.reward.accelerators=L4:none"], env={})
    with pytest.raises(ConfigError, match="services.retrieval.replicas"):
        load_config(["gsm8k"], ["services.retrieval.replicas=0"], env={})


def test_where_a_service_runs_does_not_change_the_run():
    a = load_config(["gsm8k"], env={})
    b = load_config(["gsm8k"], ["services.retrieval.replicas=3", "services.reward.cpus=8+",
                                "services.data.memory=32+", "services.reward.accelerators=A10G:1"], env={})
    assert a.digest() == b.digest()
    assert load_config(["gsm8k"], ["services.reward.max_items=8"], env={}).digest() != a.digest()
