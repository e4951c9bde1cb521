"""The vLLM eval task of a run scored by its own function (reward.path): the launch ships the file through the store,
the task's run fetches it to the node before `vllm_runner`, whose spec names that node path, and the eval scores
with it there (its components in the report; a row whose call raises scores 0 and is counted). Played as in
test_eval_dispatch.py: every line of the task's run goes in-process, with its envs, against moto S3 and the fake
vLLM; the node's work dir is a temp dir."""

from __future__ import annotations

import shlex

import pytest
import yaml
from test_skypilot_provider import FakeSky
from test_vllm_runner import GOLD, fake_vllm, write_dataset  # noqa: F401 - fake_vllm is a fixture

from verl_grpo import held_out
from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.evaluate import vllm_runner
from verl_grpo.providers.skypilot import provider as sky_provider, templates
from verl_grpo.store import Store
from verl_grpo.store_layout import model_dir
from verl_grpo.trainers.verl import reward_fetch

ENTRIES = {"python -m verl_grpo.trainers.verl.reward_fetch": reward_fetch.main,
           "python -m verl_grpo.evaluate.vllm_runner": vllm_runner.main}
REWARD = '''def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] == 0:
        raise ValueError("no verdict")
    return {"score": 0.5, "judged": 1.0}
'''


class NodePlayingSky(FakeSky):
    """launch_managed runs each line of the task's run that is one of our entries, in order, with its envs."""

    def __init__(self, monkeypatch):
        super().__init__(script=())
        self.monkeypatch = monkeypatch
        self.ran: list[str] = []

    def launch_managed(self, yaml_str, name, secrets, job_group):
        job_id = super().launch_managed(yaml_str, name, secrets, job_group)
        task = yaml.safe_load(yaml_str)
        for key, value in task["envs"].items():
            self.monkeypatch.setenv(key, value)
        rc = 0
        for line in task["run"].splitlines():
            entry = next((e for e in ENTRIES if line.strip().startswith(e)), None)
            if entry and rc == 0:
                self.ran.append(entry)
                rc = ENTRIES[entry](shlex.split(line)[3:])
        self.script = [("SUCCEEDED" if rc == 0 else "FAILED", 0, f"exit code {rc}")]
        return job_id


@pytest.mark.usefixtures("fake_vllm")
def test_the_eval_node_fetches_the_users_function_and_scores_with_it(s3_bucket, tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    monkeypatch.setenv("VERL_GRPO_MODEL_CACHE", str(tmp_path / "model-cache"))
    monkeypatch.setattr(templates, "REMOTE_WORKDIR", str(tmp_path / "node"))  # the node's /tmp/verl-grpo
    dataset, model_uri = write_dataset(store, tmp_path), store.put_dir(tiny_model_dir, model_dir("run-1"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "judge.py").write_text(REWARD)
    cfg = load_config([], ["trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:1",
                           f"storage.uri={uri}", f"storage.endpoint_url={endpoint}", "eval.limit=null",
                           "eval.max_new_tokens=32", f"reward.path={tmp_path / 'mine' / 'judge.py'}"])
    sky = NodePlayingSky(monkeypatch)
    monkeypatch.setattr(sky_provider, "boundary_from", lambda env: sky)
    monkeypatch.setattr("verl_grpo.held_out.evaluate_model", None)  # never the CPU path

    report = held_out.evaluate_trained(cfg, dataset, "run-1", model_uri, on_line=lambda _: None)

    assert sky.ran == list(ENTRIES)  # fetched, then evaluated
    (yaml_str, *_), = sky.launched
    assert str(tmp_path / "mine") not in yaml_str
    spec = vllm_runner.read_spec(store.url("runs/run-1/eval/test-vllm-spec.json"), endpoint)
    node_file = spec.run_config().reward.path
    assert node_file.startswith(f"{tmp_path / 'node'}/rewards/") and node_file.endswith("/judge.py")
    assert open(node_file).read() == REWARD
    assert report.n == len(GOLD) and report.metrics["mean_score"] == pytest.approx(0.5 * (len(GOLD) - 1) / len(GOLD))
    assert report.metrics["reward/failed"] == pytest.approx(1 / len(GOLD))


@pytest.mark.usefixtures("fake_vllm")
def test_an_eval_node_without_the_users_function_fails_before_vllm_starts(s3_bucket, tiny_model_dir, tmp_path):
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    dataset, model_uri = write_dataset(store, tmp_path), store.put_dir(tiny_model_dir, model_dir("run-1"))
    cfg = load_config([], [f"storage.uri={uri}", f"storage.endpoint_url={endpoint}",
                           f"reward.path={tmp_path / 'nowhere' / 'judge.py'}"])
    spec = vllm_runner.plan_spec(cfg, model_uri, dataset, "run-1")
    with pytest.raises(ConfigError, match="judge.py"):
        vllm_runner.run_spec(spec)
    from test_vllm_runner import FakeLLM

    assert FakeLLM.instances == []
