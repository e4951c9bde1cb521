"""A data mirror the user names (dataset.mirror_dir, VERL_GRPO_DATA_MIRROR) must hold the dataset: otherwise one
DataError line naming that setting, before a run starts; an unnamed default mirror may still fall back to the hub."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from verl_grpo.config import load_config
from verl_grpo.data import BUILDERS
from verl_grpo.data.sources import check_mirror
from verl_grpo.data.task_check import check_task
from verl_grpo.errors import DataError
from verl_grpo.plain_steps import prepare_local_state
from verl_grpo_cli.main import main


def _check(*overrides: str) -> list[str]:
    cfg = load_config([], list(overrides), env={})
    return check_mirror(cfg.dataset, BUILDERS[cfg.dataset.name])


def _message(*overrides: str) -> str:
    with pytest.raises(DataError) as err:
        _check(*overrides)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_named_mirror_dir_that_does_not_exist_fails_even_with_source_auto(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_GRPO_DATA_MIRROR", raising=False)
    missing = tmp_path / "nowhere"
    assert _message(f"dataset.mirror_dir={missing}") == (
        f"dataset gsm8k: dataset.mirror_dir {missing} does not exist (needs train.jsonl, test.jsonl); point "
        "dataset.mirror_dir at a copy of the data, or set dataset.source=hub on a machine with network access")
    (tmp_path / "a-file").write_text("")
    assert "is not a directory" in _message(f"dataset.mirror_dir={tmp_path / 'a-file'}")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.jsonl").write_text("")
    assert "half lacks test.jsonl" in _message(f"dataset.mirror_dir={tmp_path / 'half'}", "dataset.source=mirror")


def test_a_data_mirror_var_without_the_dataset_names_the_var(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_GRPO_DATA_MIRROR", str(tmp_path))
    message = _message("dataset.name=mbpp")
    assert message.startswith(f"dataset mbpp: VERL_GRPO_DATA_MIRROR={tmp_path}: {tmp_path / 'mbpp'} does not exist")
    assert "point VERL_GRPO_DATA_MIRROR at the directory holding mbpp/" in message


def test_the_default_mirror_may_fall_back_to_the_hub_unless_source_is_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_GRPO_DATA_MIRROR", raising=False)
    monkeypatch.setattr("verl_grpo.data.sources.data_mirror_dir", lambda: tmp_path / "absent")
    assert _check() == ["train.jsonl", "test.jsonl"]  # auto: the hub is tried at prepare time
    assert "set VERL_GRPO_DATA_MIRROR to the directory holding gsm8k/" in _message("dataset.source=mirror")


def test_a_hub_source_never_looks_at_the_mirror(tmp_path, monkeypatch):
    looked = []
    monkeypatch.setattr("verl_grpo.data.sources.resolve_mirror_dir", lambda dcfg: looked.append(dcfg) or tmp_path)
    cfg = load_config([], [f"dataset.mirror_dir={tmp_path / 'nowhere'}", "dataset.source=hub"], env={})
    prepare_local_state(cfg, data=True)
    assert check_task(cfg) == "gsm8k from the hub"
    assert looked == [] and not (tmp_path / "nowhere").exists()


def test_a_run_checks_the_mirror_before_it_starts_other_commands_do_not(tmp_path):
    cfg = load_config([], [f"dataset.mirror_dir={tmp_path / 'nowhere'}"], env={})
    prepare_local_state(cfg)  # validate, home, models: their own checks report it, or they do not need data
    with pytest.raises(DataError, match=r"^dataset gsm8k: dataset\.mirror_dir "):
        prepare_local_state(cfg, data=True)


def test_the_cli_run_fails_in_one_line_before_prefect(tmp_path):
    result = CliRunner(mix_stderr=False).invoke(
        main, ["run", "-c", "gsm8k", "-c", "local", "-o", f"dataset.mirror_dir={tmp_path / 'nowhere'}"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error (DataError): dataset gsm8k: dataset.mirror_dir ")
    assert result.stderr.count("\n") == 1, result.stderr
