"""Where a run's work happens, answered by its provider's entry in the placement table."""

from __future__ import annotations

import typing

from verl_grpo.config import RunConfig, load_config
from verl_grpo.config.defaults import resolve_defaults
from verl_grpo.config.placement import PLACEMENTS, placement
from verl_grpo.config.schema import InfraConfig
from verl_grpo.providers import PROVIDERS


def test_every_provider_the_config_accepts_has_a_placement_and_a_class():
    names = set(typing.get_args(InfraConfig.model_fields["provider"].annotation))
    assert names == set(PLACEMENTS) == set(PROVIDERS)


def test_local_runs_here_and_skypilot_shapes_and_clusters_are_its_own():
    local = placement(load_config([], [], env={}))
    assert (local.on_this_machine, local.shape, local.fully_async, local.existing_cluster) == (True, "local", False,
                                                                                              None)
    group = placement(load_config([], ["trainer.backend=verl", "infra.provider=skypilot",
                                       "skypilot.shape=rollout_group"], env={}))
    assert (group.on_this_machine, group.fully_async, group.existing_cluster) == (False, True, None)
    existing = placement(load_config([], ["trainer.backend=verl", "infra.provider=skypilot",
                                          "skypilot.cluster=my-h100s"], env={}))
    assert (existing.shape, existing.existing_cluster) == ("multinode", "my-h100s")


def test_the_services_a_placement_implies_are_resolved_once_after_validation_and_resolve_to_themselves():
    sky = ["trainer.backend=verl", "infra.provider=skypilot", "warm_start.enabled=false"]
    assert RunConfig.model_validate({"infra": {"provider": "skypilot"}, "trainer": {"backend": "verl"},
                                     "skypilot": {"shape": "job_group"}}).services.enabled == []  # validation only
    cases = {("skypilot.shape=job_group",): ["reward"],
             ("skypilot.shape=job_group", "services.enabled=[retrieval]"): ["retrieval"],
             ("skypilot.shape=rollout_group",): ["data", "reward", "replay"],
             ("skypilot.shape=multinode",): []}
    for overrides, enabled in cases.items():
        cfg = load_config([], [*sky, *overrides], env={})
        assert cfg.services.enabled == enabled, overrides
        assert resolve_defaults(cfg) == cfg
