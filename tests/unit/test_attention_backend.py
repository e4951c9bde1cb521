"""The attention backend of the trained models: rendered into verl's own config, refused by the dry run where the
nodes cannot load it, and failing on a rehearsal node as on a GPU node (verl 0.9.1 defaults to flash_attention_2,
which `verl[vllm]` does not install)."""

from __future__ import annotations

from functools import partial

import pytest
from run_configs import VERL_H100_1, build_config

from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot.dry_run import check_attention
from verl_grpo.providers.skypilot.templates import cluster_packages
from verl_grpo.trainers.verl.overrides import VerlPaths, attention_overrides, verl_overrides
from verl_grpo.trainers.verl.validation import compose_verl_config
from verl_grpo_rehearsal import ENV_ON_NODE, shims
from verl_grpo_rehearsal.standin_actor import node_attention

FILES = {"train": "/w/train.parquet", "val": "/w/val.parquet"}
VERL_PATHS = VerlPaths(checkpoint_dir="/w/c")
FLASH_WHEEL = "flash-attn @ https://example.org/flash_attn-2.8.3+cu12torch2.11-cp312-cp312-linux_x86_64.whl"


_cfg = partial(build_config, *VERL_H100_1, env={})


def _model_cfgs(cfg, drop: tuple[str, ...] = ()):
    """verl's own composed config for this run's overrides (less those in `drop`): the actor's and (with a
    critic) the critic's model."""
    overrides = [o for o in verl_overrides(cfg, FILES, VERL_PATHS, "r1", env={}) if o not in drop]
    composed = compose_verl_config(overrides)
    return [composed.actor_rollout_ref.model] + ([composed.critic.model] if composed.critic.enable else [])


def test_sdpa_is_the_default_and_turns_remove_padding_off_for_every_trained_model():
    models = _model_cfgs(_cfg("verl.adv_estimator=gae"))
    assert len(models) == 2
    for model in models:
        assert model.override_config.attn_implementation == "sdpa"
        assert model.use_remove_padding is False
        assert node_attention(model) == "sdpa"


def test_flash_attention_keeps_remove_padding():
    (model,) = _model_cfgs(_cfg("verl.attn_implementation=flash_attention_2"))
    assert model.override_config.attn_implementation == "flash_attention_2"
    assert model.use_remove_padding is True


def test_the_dry_run_names_the_backend_and_refuses_flash_attention_the_nodes_do_not_install():
    assert check_attention(_cfg()).startswith("attention: sdpa, use_remove_padding off")
    with pytest.raises(ConfigError) as e:
        check_attention(_cfg("verl.attn_implementation=flash_attention_2"))
    text = str(e.value)
    assert "\n" not in text
    assert "verl.attn_implementation=flash_attention_2" in text and "skypilot.node_packages" in text
    cfg = _cfg("verl.attn_implementation=flash_attention_2", f"skypilot.node_packages=[{FLASH_WHEEL!r}]")
    assert "flash-attn from skypilot.node_packages" in check_attention(cfg)
    assert cluster_packages(cfg, "vllm")[-1] == FLASH_WHEEL


def test_a_bare_wheel_url_in_node_packages_is_refused_with_the_form_to_use():
    cfg = _cfg("verl.attn_implementation=flash_attention_2",
               "skypilot.node_packages=['https://example.org/flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl']")
    with pytest.raises(ConfigError, match="skypilot.node_packages: .* write a wheel URL as 'NAME @ URL'"):
        check_attention(cfg)


@pytest.fixture
def node_tmp(tmp_path, monkeypatch):
    """A rehearsal node's own record of what setup installed (its private /tmp on a node)."""
    monkeypatch.setattr(shims, "STANDINS_FILE", tmp_path / "standins")
    monkeypatch.setenv(ENV_ON_NODE, "1")
    return tmp_path


def test_verls_default_attention_fails_on_a_node_whose_setup_installs_no_flash_attn(node_tmp):
    """Today's launch before the fix: no override_config, so verl loads flash_attention_2."""
    cfg = _cfg()
    (model,) = _model_cfgs(cfg, drop=tuple(attention_overrides(cfg)))
    with pytest.raises(ImportError, match="FlashAttention2 .* flash_attn seems to be not installed"):
        node_attention(model)


def test_flash_attention_is_stood_in_where_setup_installed_flash_attn(node_tmp, capsys):
    assert shims.check_install([FLASH_WHEEL]) == 0
    (model,) = _model_cfgs(_cfg("verl.attn_implementation=flash_attention_2"))
    assert node_attention(model) == "sdpa"
    assert "rehearsal: flash_attention_2 stood in by sdpa" in capsys.readouterr().out


def test_remove_padding_without_flash_attention_is_refused(node_tmp):
    (model,) = _model_cfgs(_cfg())
    model.use_remove_padding = True
    with pytest.raises(ConfigError, match="use_remove_padding=True with attn_implementation=sdpa"):
        node_attention(model)
