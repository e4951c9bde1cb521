"""The dry run seeds SkyPilot's catalog cache from the local data mirror, never overwriting what is there."""

from __future__ import annotations

from types import SimpleNamespace

from verl_grpo.providers.skypilot.cost import seed_catalog_cache


def test_seed_copies_missing_files_only(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    (mirror / "skypilot-catalog" / "v8" / "lambda").mkdir(parents=True)
    (mirror / "skypilot-catalog" / "v8" / "lambda" / "vms.csv").write_text("InstanceType\nnew\n")
    (mirror / "skypilot-catalog" / "v8" / "common").mkdir()
    (mirror / "skypilot-catalog" / "v8" / "common" / "accelerators.csv").write_text("AcceleratorName\n")
    monkeypatch.setenv("VERL_GRPO_DATA_MIRROR", str(mirror))
    cache = tmp_path / "cache"
    (cache / "lambda").mkdir(parents=True)
    (cache / "lambda" / "vms.csv").write_text("InstanceType\nexisting\n")
    copied = seed_catalog_cache(SimpleNamespace(catalog_dir=lambda: str(cache)))
    assert copied == [cache / "common" / "accelerators.csv"]
    assert (cache / "lambda" / "vms.csv").read_text() == "InstanceType\nexisting\n"
    assert seed_catalog_cache(SimpleNamespace(catalog_dir=lambda: str(tmp_path / "none"))) != []
    monkeypatch.setenv("VERL_GRPO_DATA_MIRROR", str(tmp_path / "empty"))
    assert seed_catalog_cache(SimpleNamespace(catalog_dir=lambda: str(tmp_path / "x"))) == []
