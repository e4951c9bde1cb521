"""The evaluate step's dispatch: skypilot → the vLLM eval task (rendered, launched, report read back); else CPU.

SkyPilot is the fake boundary of test_skypilot_provider.py; its launch plays the cluster: it runs the rendered
task's command (`python -m verl_grpo.evaluate.vllm_runner SPEC`) in-process with the task's envs, against a real
S3 endpoint (moto) and the fake `vllm` of test_vllm_runner.py.
"""

from __future__ import annotations

import os
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from run_configs import VERL_H100_8, build_config
from test_skypilot_provider import FakeCluster, FakeSky
from test_vllm_runner import FakeLLM, fake_vllm, write_dataset  # noqa: F401 - fake_vllm is a fixture

from verl_grpo import held_out
from verl_grpo.config import load_config
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import ConfigError, TrainingError
from verl_grpo.evaluate import vllm_runner
from verl_grpo.providers.skypilot import provider as sky_provider, templates
from verl_grpo.providers.skypilot.boundary import JobRecord
from verl_grpo.store import Store
from verl_grpo.store_layout import model_dir

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "skypilot-eval.yaml"
SPEC_URI = "s3://bucket/store/runs/run-1/eval/test-vllm-spec.json"


def _cfg(*extra: str, uri: str = "s3://bucket/store", endpoint: str | None = None):
    return build_config(*VERL_H100_8, "infra.spot=true", "skypilot.cloud=aws", f"storage.uri={uri}",
                        *([f"storage.endpoint_url={endpoint}"] if endpoint else []),
                        "eval.limit=null", "eval.max_new_tokens=32", *extra)


def _render(*extra: str, env=None) -> templates.RenderedTask:
    return templates.render_eval(_cfg(*extra, endpoint="http://minio:9000"), "run-1", SPEC_URI,
                                 env if env is not None else {"WANDB_API_KEY": "sekret-wandb",
                                                              "AWS_ACCESS_KEY_ID": "AKIA-sekret",
                                                              "AWS_SECRET_ACCESS_KEY": "aws-sekret"},
                                 workdir="/src/verl-grpo")


def test_eval_task_matches_golden():
    text = _render().yaml
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"rendered YAML differs from {GOLDEN}; rerun with UPDATE_GOLDEN=1 if intended"


def test_eval_task_runs_the_vllm_runner_on_one_rollout_engines_gpus_with_store_secrets_by_name():
    rendered = _render("verl.rollout_tp=2")
    task = yaml.safe_load(rendered.yaml)
    assert (rendered.name, rendered.is_job_group) == ("verl-grpo-run-1-eval", False)
    assert task["resources"]["accelerators"] == "H100:2" and task["resources"]["use_spot"] is True
    assert task["resources"]["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
    assert task["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}  # no W&B key: not needed
    assert not {"sekret", "AKIA"} & {w for v in task["envs"].values() for w in str(v).split("-")}
    assert "sekret" not in rendered.yaml
    assert task["envs"]["VERL_GRPO_STORE_ENDPOINT"] == "http://minio:9000"
    assert task["run"].strip().splitlines()[-1] == f"python -m verl_grpo.evaluate.vllm_runner {SPEC_URI}"
    assert "uv pip install --no-deps -e ." in task["setup"] and "--system" not in task["setup"]
    assert task["run"].splitlines()[1] == ". \"$VERL_GRPO_VENV/bin/activate\""


def test_eval_packages_are_pinned_like_the_project_and_vllm_like_verl():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    vllm, transformers, *rest = templates.EVAL_PACKAGES
    assert vllm == f"vllm=={templates.VLLM_VERSION}"
    assert set(rest) <= set(project), f"{set(rest) - set(project)} are not pyproject.toml dependencies as written"
    from importlib.metadata import requires

    assert f'vllm=={templates.VLLM_VERSION}; extra == "vllm"' in requires("verl")
    # vLLM alone would resolve a newer transformers; the eval node gets the one verl pins for training
    assert f'{transformers}; extra == "vllm"' in requires("verl")


def test_a_run_that_searched_is_evaluated_with_the_tool_so_its_eval_node_installs_the_loop_and_a_retriever():
    assert templates.eval_packages(_cfg()) == templates.EVAL_PACKAGES
    searched = templates.eval_packages(_cfg("services.enabled=[retrieval]"))
    assert searched[:len(templates.EVAL_PACKAGES)] == templates.EVAL_PACKAGES
    extra = searched[len(templates.EVAL_PACKAGES):]
    # TRL parses the tool calls as on the CPU path; the node serves the run's index with a retrieval-server of its own
    assert extra == (f"trl=={templates.TRL_VERSION}", *templates.SERVICE_PACKAGES)
    outside = templates.eval_packages(_cfg("services.enabled=[retrieval]", "services.retrieval.url=http://r:8000"))
    assert outside[len(templates.EVAL_PACKAGES):] == (f"trl=={templates.TRL_VERSION}", "httpx")  # only a client
    task = yaml.safe_load(_render("services.enabled=[retrieval]").yaml)
    assert f"trl=={templates.TRL_VERSION}" in task["setup"] and "bm25s" in task["setup"]
    lock = (REPO / "requirements.lock").read_text().splitlines()
    assert f"trl=={templates.TRL_VERSION}" in lock  # the parser training used


@pytest.mark.parametrize(("extra", "expected"), [
    ((), ("H100:1", 1)),
    (("verl.rollout_tp=4",), ("H100:4", 4)),
    (("skypilot.eval_accelerators=A100-80GB:2",), ("A100-80GB:2", 2)),
    (("skypilot.eval_accelerators=L4",), ("L4", 1)),
])
def test_eval_accelerators(extra, expected):
    assert templates.eval_accelerators(_cfg(*extra)) == expected


def test_fractional_eval_gpus_name_the_field():
    with pytest.raises(ConfigError, match="skypilot.eval_accelerators 'A100:0.5'"):
        templates.eval_accelerators(_cfg("skypilot.eval_accelerators=A100:0.5"))


class ClusterPlayingSky(FakeSky):
    """launch_managed runs the task's command here, with its envs, then reports the job by the exit code."""

    def __init__(self, monkeypatch):
        super().__init__(script=())
        self.monkeypatch = monkeypatch

    def launch_managed(self, yaml_str, name, secrets, job_group):
        job_id = super().launch_managed(yaml_str, name, secrets, job_group)
        task = yaml.safe_load(yaml_str)
        for key, value in task["envs"].items():
            self.monkeypatch.setenv(key, value)
        argv = shlex.split(task["run"].strip().splitlines()[-1])
        assert argv[:3] == ["python", "-m", "verl_grpo.evaluate.vllm_runner"]
        rc = vllm_runner.main(argv[3:])
        self.script = [("SUCCEEDED" if rc == 0 else "FAILED", 0, f"exit code {rc}")]
        return job_id


@pytest.fixture
def on_s3(s3_bucket, tiny_model_dir, tmp_path, monkeypatch):
    uri, endpoint = s3_bucket
    monkeypatch.setenv("VERL_GRPO_MODEL_CACHE", str(tmp_path / "model-cache"))  # the "cluster's" download
    store = Store(uri, endpoint)
    return store, write_dataset(store, tmp_path), store.put_dir(tiny_model_dir, model_dir("run-1"))


def _use(monkeypatch, sky):
    monkeypatch.setattr(sky_provider, "boundary_from", lambda env: sky)


@pytest.mark.usefixtures("fake_vllm")
def test_skypilot_evaluate_launches_the_vllm_task_and_reads_its_report_from_the_store(on_s3, monkeypatch):
    store, dataset, model_uri = on_s3
    sky = ClusterPlayingSky(monkeypatch)
    _use(monkeypatch, sky)
    monkeypatch.setattr("verl_grpo.held_out.evaluate_model", _no_cpu_eval)
    cfg = _cfg("verl.rollout_tp=2", uri=store.uri, endpoint=store.endpoint_url)
    lines = []

    report = held_out.evaluate_trained(cfg, dataset, "run-1", model_uri, on_line=lines.append)

    (yaml_str, name, secrets, job_group), = sky.launched
    assert (name, job_group) == ("verl-grpo-run-1-eval", False)
    assert secrets == {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    assert "testing" not in yaml_str
    assert lines == ["job 1 step 1", "job 1 step 2"]
    assert report == EvalReport.model_validate_json(store.read_text("runs/run-1/eval/test.json"))
    assert (report.model_uri, report.n, report.table_uri) == (model_uri, 3, store.url("runs/run-1/eval/test.parquet"))
    assert report.metrics["accuracy"] == pytest.approx(2 / 3)
    (llm,) = FakeLLM.instances
    assert llm.kwargs["tensor_parallel_size"] == 2  # vLLM spans the eval task's GPUs


@pytest.mark.usefixtures("fake_vllm")
def test_failed_eval_job_is_a_training_error(on_s3, monkeypatch):
    store, dataset, _ = on_s3
    sky = ClusterPlayingSky(monkeypatch)
    _use(monkeypatch, sky)
    cfg = _cfg(uri=store.uri, endpoint=store.endpoint_url)
    missing_model = store.url("runs/no-such-run/model")
    with pytest.raises(TrainingError, match="verl-grpo-run-1-eval"):
        held_out.evaluate_trained(cfg, dataset, "run-1", missing_model, on_line=lambda _: None)


def test_eval_on_an_unreachable_store_or_local_model_fails_before_launch(monkeypatch, tmp_path, tiny_model_dir):
    sky = FakeSky()
    _use(monkeypatch, sky)
    dataset = _dataset("s3://bucket/store")
    with pytest.raises(ConfigError, match="storage.uri"):
        held_out.evaluate_trained(_cfg(uri=f"file://{tmp_path}"), dataset, "run-1", "s3://bucket/store/runs/run-1/model")
    with pytest.raises(ConfigError, match="out of the eval task's reach"):
        held_out.evaluate_trained(_cfg(), dataset, "run-1", str(tiny_model_dir))
    assert sky.launched == []


def test_retry_reattaches_to_the_live_eval_job_without_rewriting_its_spec(monkeypatch):
    sky = FakeSky(script=[("RUNNING", 0, None)])
    sky.jobs[7] = JobRecord(7, "verl-grpo-run-1-eval", "RUNNING")
    monkeypatch.setattr(vllm_runner, "write_spec", _no_spec_write)
    provider = sky_provider.SkyPilotProvider(boundary=sky, env={})
    job = provider.submit_eval(_cfg(), "run-1", "s3://bucket/store/runs/run-1/model", _dataset("s3://bucket/store"))
    assert (job.id, job.name, sky.launched) == ("7", "verl-grpo-run-1-eval", [])


def test_interrupted_eval_is_cancelled(monkeypatch):
    sky = FakeSky(script=[("RUNNING", 0, None)])
    _use(monkeypatch, sky)
    monkeypatch.setattr(vllm_runner, "write_spec", lambda spec, store: SPEC_URI)

    def interrupt(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        held_out.evaluate_trained(_cfg(), _dataset("s3://bucket/store"), "run-1", "s3://bucket/store/runs/run-1/model",
                          on_line=interrupt)
    assert sky.cancelled == [1]


def test_existing_cluster_runs_the_eval_with_sky_exec(monkeypatch):
    sky = FakeCluster(script=[("SUCCEEDED",)])
    monkeypatch.setattr(vllm_runner, "write_spec", lambda spec, store: SPEC_URI)
    provider = sky_provider.SkyPilotProvider(boundary=sky, env={"HF_TOKEN": "hf_secret", "AWS_ACCESS_KEY_ID": "k"})
    cfg = _cfg("skypilot.cluster=my-h100s")
    job = provider.submit_eval(cfg, "run-1", "s3://bucket/store/runs/run-1/model", _dataset("s3://bucket/store"))
    (cluster, yaml_str, secrets), = sky.execs
    task = yaml.safe_load(yaml_str)
    assert (cluster, job.id, sky.launched) == ("my-h100s", "my-h100s/1", [])
    assert secrets == {"AWS_ACCESS_KEY_ID": "k"} and "job_recovery" not in task["resources"]
    assert provider.status(job).phase == "SUCCEEDED"


def test_local_provider_evaluates_on_this_machine_without_a_job(monkeypatch, tmp_path):
    calls = []
    report = EvalReport(model_uri="m", split="test", n=1, metrics={"accuracy": 1.0}, table_uri="t", settings_key="k")

    def cpu_eval(cfg, model_uri, dataset, store, **kwargs):
        calls.append((model_uri, kwargs["out_rel"]))
        return report

    monkeypatch.setattr("verl_grpo.held_out.evaluate_model", cpu_eval)
    cfg = load_config([], [f"storage.uri=file://{tmp_path}"])
    assert held_out.evaluate_trained(cfg, _dataset(f"file://{tmp_path}"), "run-1", "m") == report
    assert calls == [("m", "runs/run-1/eval/test.parquet")]  # the table beside the run
    assert EvalReport.model_validate_json((tmp_path / "runs/run-1/eval/test.json").read_text()) == report


def _dataset(store_uri: str) -> DatasetVersion:
    uri = f"{store_uri}/datasets/gsm8k/h1"
    return DatasetVersion(name="gsm8k", hash="h1", uri=uri, splits={"test": f"{uri}/test.parquet"},
                          counts={"test": 3})


def _no_cpu_eval(*args, **kwargs):
    raise AssertionError("the skypilot provider's eval must not run on this machine's CPU")



def _no_spec_write(spec, store):
    raise AssertionError("a reattach must not rewrite the live job's spec")


def test_training_setup_installs_verl_beside_our_runtime_without_our_pins():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    project = [*meta["dependencies"], *meta["optional-dependencies"]["search"]]  # the services' retrieval stack
    cfg = build_config(*VERL_H100_8, "skypilot.shape=job_group", files=["gsm8k"], env={})
    verl, transformers, *rest = templates.cluster_packages(cfg, "vllm")
    assert verl == "verl[vllm]==0.9.1" and transformers == "transformers==5.9.0"  # verl's own pin, spelled out
    assert set(rest) <= set(project)
    assert not any(p.startswith(("torch", "transformers", "prefect", "mlflow")) for p in rest)
