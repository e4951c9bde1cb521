"""Each check the launch makes (verl_grpo/providers/skypilot/checks.py), tripped by the bad input it exists for: the
failure is one line naming the key and the fix, and never carries a secret's value."""

from __future__ import annotations

import socket
from functools import partial

import pytest
from run_configs import VERL_ON_SKYPILOT, build_config

from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot import checks
from verl_grpo.providers.skypilot.boundary import Offer

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


_cfg = partial(build_config, *VERL_ON_SKYPILOT, "warm_start.enabled=false", files=["gsm8k"], env={})


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_file_store_is_rejected_naming_storage_uri():
    with pytest.raises(ConfigError) as e:
        checks.require_remote_store(_cfg())
    assert _one_line(e).startswith("storage.uri 'file://") and "s3://bucket/prefix" in str(e.value)
    assert "is S3" in checks.require_remote_store(_cfg("storage.uri=s3://bucket/prefix"))


def test_an_endpoint_nobody_listens_on_is_reported_with_its_key():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _cfg("storage.uri=s3://bucket/prefix", f"storage.endpoint_url=http://127.0.0.1:{port}")
    with pytest.raises(ConfigError) as e:
        checks.check_store_endpoint(cfg, timeout=1.0)
    assert _one_line(e).startswith(f"storage.endpoint_url http://127.0.0.1:{port} is not reachable")
    assert "unset storage.endpoint_url" in str(e.value)


def test_a_listening_endpoint_passes_and_a_malformed_one_fails():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        line = checks.check_store_endpoint(_cfg(f"storage.endpoint_url=http://127.0.0.1:{port}"))
    assert "accepts connections" in line
    with pytest.raises(ConfigError) as e:
        checks.check_store_endpoint(_cfg("storage.endpoint_url=minio:9000"))
    assert "storage.endpoint_url 'minio:9000' is not an http(s)://host[:port] URL" in _one_line(e)


def test_missing_aws_keys_are_named_and_a_profile_with_keys_is_pointed_at_without_its_values(tmp_path):
    with pytest.raises(ConfigError) as e:
        checks.check_store_credentials({"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")})
    assert _one_line(e).startswith("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set")
    creds = tmp_path / "credentials"
    creds.write_text(f"[research]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = {SECRET}\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_PROFILE": "research", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}
    with pytest.raises(ConfigError) as e:
        checks.check_store_credentials(env)
    message = _one_line(e)
    assert message.startswith("AWS_SECRET_ACCESS_KEY not set") and "profile 'research'" in message
    assert "export-credentials --profile research" in message
    assert SECRET not in message and "AKIAEXAMPLE" not in message
    ok = checks.check_store_credentials({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET})
    assert SECRET not in ok and "AKIAEXAMPLE" not in ok


def test_a_malformed_wandb_key_is_named_without_its_value():
    bad = "not-a-key"
    with pytest.raises(ConfigError) as e:
        checks.check_wandb_key({"WANDB_API_KEY": bad})
    assert _one_line(e).startswith("WANDB_API_KEY is not a W&B API key") and bad not in str(e.value)
    assert "unset" in checks.check_wandb_key({})
    assert "shaped like" in checks.check_wandb_key({"WANDB_API_KEY": "a" * 40})


@pytest.mark.parametrize("name", ["qwen 1.5b", "Qwen/Qwen2.5--1.5B", "Qwen/Qwen2.5-1.5B/extra", "./no/such/dir"])
def test_a_malformed_model_id_is_rejected_naming_model_name(name):
    with pytest.raises(ConfigError) as e:
        checks.check_model_name(_cfg(f"model.name={name}"))
    assert _one_line(e).startswith(f"model.name {name!r}") and "Qwen/Qwen2.5-1.5B-Instruct" in str(e.value)


def test_ids_aliases_and_local_models_pass(tmp_path):
    assert "Hugging Face id" in checks.check_model_name(_cfg())
    assert "alias of HuggingFaceTB/SmolLM2-135M-Instruct" in checks.check_model_name(_cfg("model.name=smollm2-135m"))
    assert "ships to the cluster" in checks.check_model_name(_cfg("model.name=tiny"))
    with pytest.raises(ConfigError) as e:
        checks.check_model_name(_cfg(f"model.name={tmp_path}"))
    assert "without config.json" in _one_line(e)
    (tmp_path / "config.json").write_text("{}")
    assert "ships to the cluster" in checks.check_model_name(_cfg(f"model.name={tmp_path}"))


def test_missing_data_splits_are_named_by_the_setting_that_points_at_them(tmp_path):
    with pytest.raises(ConfigError) as e:
        checks.check_data(_cfg(f"dataset.mirror_dir={tmp_path}", "dataset.source=mirror"))
    assert "dataset.mirror_dir" in _one_line(e) and "train.jsonl" in str(e.value)


class CatalogSky:
    """The catalog half of the `sky` boundary: one local catalog (`lambda`) with the given offers."""

    def __init__(self, tmp_path, offers):
        (tmp_path / "lambda").mkdir(exist_ok=True)
        (tmp_path / "lambda" / "vms.csv").write_text("InstanceType\n")
        self.root, self.offers, self.asked = tmp_path, offers, []

    def catalog_dir(self):
        return str(self.root)

    def catalog_offers(self, accelerator, count, cloud, region, clouds):
        self.asked.append((accelerator, count, cloud, region, tuple(clouds)))
        return self.offers, []


def test_spot_falls_back_to_on_demand_with_one_warning_where_no_offer_sells_it(tmp_path):
    sky = CatalogSky(tmp_path, [Offer("lambda", "gpu_1x_h100_pcie", 3.29, None)])
    cfg, warning = checks.with_spot_choice(_cfg("storage.uri=s3://b/p"), sky)
    assert cfg.infra.spot is False and sky.asked == [("H100", 1, None, None, ("lambda",))]
    assert warning.startswith("infra.spot=true but no catalog offer of H100:1 on lambda sells spot: launching "
                              "on-demand") and "infra.spot=false" in warning


def test_spot_stays_where_an_offer_sells_it_and_off_stays_off(tmp_path):
    sky = CatalogSky(tmp_path, [Offer("aws", "p5.xlarge", 6.0, 2.5), Offer("lambda", "gpu_1x_h100_pcie", 3.29, None)])
    cfg, warning = checks.with_spot_choice(_cfg(), sky)
    assert cfg.infra.spot is True and warning is None
    cfg, warning = checks.with_spot_choice(_cfg("infra.spot=false"), sky)
    assert cfg.infra.spot is False and warning is None


def test_a_secret_value_in_the_rendered_yaml_fails_the_dry_run():
    from verl_grpo.providers.skypilot import dry_run, templates

    cfg = _cfg("skypilot.shape=job_group", "services.enabled=[reward]")
    leaky = templates.RenderedTask("verl-grpo-x", "job_group", "envs:\n  WANDB: wandb-value-123\n")
    with pytest.raises(ConfigError, match="contains the value of WANDB_API_KEY"):
        dry_run._check_launch_secrets(cfg, leaky, None, {"WANDB_API_KEY": "wandb-value-123"})


def test_a_job_group_on_a_vm_cloud_is_refused_naming_skypilot_cloud():
    """SkyPilot 0.14.1 gives a job group's tasks hostnames only on Kubernetes: the trainer would resolve no service."""
    from verl_grpo.providers.skypilot.dry_run import check_placement

    for shape in ("job_group", "rollout_group"):
        with pytest.raises(ConfigError) as e:
            check_placement(_cfg(f"skypilot.shape={shape}", "skypilot.cloud=lambda"))
        assert _one_line(e).startswith(f"skypilot.shape={shape} reaches its services by job-group hostnames")
        assert "skypilot.cloud=kubernetes" in str(e.value)
        assert "Kubernetes (job-group hostnames" in check_placement(
            _cfg(f"skypilot.shape={shape}", "skypilot.cloud=kubernetes"))
        assert check_placement(_cfg(f"skypilot.shape={shape}")).startswith("placement: Kubernetes only")
    assert "SKYPILOT_NODE_IPS" in check_placement(_cfg("skypilot.cloud=lambda", "infra.nodes=2"))


def test_the_credential_path_is_named_and_no_node_mounts_a_bucket_on_any_cloud():
    """Defect 4 of the first launch: a bucket mount gets no credentials from the environment off AWS; every node now
    reads, syncs and commits with the task's secrets on every cloud, so no shape mounts a bucket."""
    from rendered_tasks import render

    from verl_grpo.providers.skypilot.dry_run import credential_path

    assert credential_path(_cfg()).endswith("with the task's AWS secrets (s3fs); no bucket is mounted")
    for cloud in ("lambda", "aws"):
        line = credential_path(_cfg("infra.nodes=2", f"skypilot.cloud={cloud}"))
        assert "no bucket is mounted" in line and "checkpoint sync uploads its shards with the same secrets" in line
    for shape in ("multinode", "job_group", "rollout_group"):
        text = render(shape, {}, "skypilot.cloud=kubernetes" if shape != "multinode" else "skypilot.cloud=lambda").yaml
        assert "MOUNT_CACHED" not in text and "file_mounts" not in text
        assert "setsid python -m verl_grpo.trainers.verl.checkpoint_sync >> " in text

def test_a_kubernetes_launch_is_priced_from_the_clusters_own_rates():
    """No SkyPilot catalog prices Kubernetes: skypilot.kubernetes_prices does, for every task of the group."""
    from verl_grpo.providers.skypilot.cost import estimate_kubernetes_cost, launch_tasks

    rates = "skypilot.kubernetes_prices={H100: 2.5, cpu: 0.05, memory: 0.01}"
    cfg = _cfg("skypilot.shape=job_group", "skypilot.cloud=kubernetes", "services.enabled=[data,reward,retrieval]",
               rates)
    estimate = estimate_kubernetes_cost(cfg)
    (row,) = estimate.rows
    expected = 0.0
    for task in launch_tasks(cfg):
        gpus = int(task.accelerators.split(":")[1]) * 2.5 if task.accelerators else 0.0
        cpus = float(task.cpus.rstrip("+")) * 0.05 if task.cpus else 0.0
        memory = float(task.memory.rstrip("+")) * 0.01 if task.memory else 0.0
        expected += task.nodes * task.hours * (gpus + cpus + memory)
    assert row.cloud == "kubernetes" and row.spot is None and abs(row.on_demand - expected) < 1e-9
    assert expected > 0 and any(t.cpus for t in launch_tasks(cfg))  # the services' CPUs are in it
    assert any("kubernetes" in line for line in estimate.render_lines())
    with pytest.raises(ConfigError, match=r"skypilot.kubernetes_prices has no price for H100"):
        estimate_kubernetes_cost(_cfg("skypilot.shape=job_group", "skypilot.cloud=kubernetes",
                                      "skypilot.kubernetes_prices={A100: 1.5}"))
