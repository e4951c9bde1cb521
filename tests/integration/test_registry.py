"""register_run against a real MLflow (SQLite file; one test against `mlflow server`), with the tiny model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from metrics_lines import trl_lines
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient
from registry_runs import SPLIT, N, correct_first, make_env, make_run, outcome, register, stored_report
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_grpo.contracts import RunCost
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.provenance import git_sha
from verl_grpo.registry import download_version, list_models, register_run
from verl_grpo_tasks.reporting import curve_png_location


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path)


def test_first_model_is_logged_registered_and_loads_back(env, tiny_model_dir, tmp_path):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))

    version = register(cfg, store, dataset, train, report, base)

    assert (version.name, version.version, version.aliases) == ("verl-grpo-gsm8k", "1", ["champion"])
    assert "first model" in version.decision
    client = MlflowClient(cfg.tracking.mlflow_uri)
    run = client.get_run(version.mlflow_run_id)
    assert run.data.tags["verl_grpo.run_id"] == "run-a"
    assert run.data.tags["dataset.hash"] == "h1" and run.data.tags["git.sha"] == "abc123"
    assert run.data.tags["checkpoint_uri"].endswith("global_step_3")
    # the run page's description and a runs-table column carry the outcome
    assert run.data.tags["mlflow.note.content"].startswith(f"**verl-grpo-gsm8k v1**: {version.decision}")
    assert "accuracy 0.250 on test, n=40" in run.data.tags["mlflow.note.content"]
    assert run.data.tags["promotion.decision"] == "first-model"
    assert run.data.params["algorithm.rollouts"] == "4" and run.data.params["eval.limit"] == "50"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1.0, 0.5, 1.0 / 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/reward/mean")] == [1, 2, 3]
    assert run.data.metrics["eval.accuracy"] == 0.25 and run.data.metrics["delta.accuracy"] == 0.25
    assert run.data.metrics["eval.pass_at_4"] == 0.25 and "delta.n" not in run.data.metrics
    # The run page's chart sections come from the part before a name's last slash: only the training curves have
    # one, so they lead and the single values (one bar each) follow in the unprefixed "Model metrics" section.
    assert {k for k in run.data.metrics if "/" in k} == {
        k for k in run.data.metrics if k.startswith("train/")} and "train/loss" in run.data.metrics
    assert {len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics if "/" not in k} == {1}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {
        a.path for d in ("eval", "data") for a in client.list_artifacts(run.info.run_id, d)}
    assert {"config.yaml", "data/manifest.json", "eval/test.parquet", "eval/base-test.parquet",
            "eval/test-side_by_side.json"} <= artifacts
    # base and trained per problem in a table MLflow's UI renders, the problems whose verdict flipped first
    side = json.loads(Path(client.download_artifacts(run.info.run_id, "eval/test-side_by_side.json", str(tmp_path)))
                      .read_text())
    rows = [dict(zip(side["columns"], row)) for row in side["data"]]
    assert [r["flip"] for r in rows] == ["fixed"] * 10 + [""] * 30
    assert rows[0]["base_correct"] is False and rows[0]["trained_correct"] is True
    mv = client.get_model_version("verl-grpo-gsm8k", "1")
    assert mv.tags["promotion.decision"] == "first-model" and "eval.accuracy" not in mv.tags  # numbers: on the run

    hf_dir = download_version(cfg.tracking.mlflow_uri, "verl-grpo-gsm8k", "champion", tmp_path / "dl")
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    pairs = zip(model.state_dict().values(), original.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_retry_reuses_run_and_version(env, tiny_model_dir):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))

    first = register(cfg, store, dataset, train, report, base)
    again = register(cfg, store, dataset, train, report, base)

    assert (again.version, again.mlflow_run_id, again.decision) == (first.version, first.mlflow_run_id, first.decision)
    client = MlflowClient(cfg.tracking.mlflow_uri)
    assert len(client.search_model_versions("name='verl-grpo-gsm8k'")) == 1
    assert len(client.search_runs([client.get_experiment_by_name("verl-grpo/gsm8k").experiment_id])) == 1
    assert len(client.get_metric_history(first.mlflow_run_id, "train/loss")) == 3
    run = client.get_run(first.mlflow_run_id)
    assert len(run.inputs.dataset_inputs) == 1 and len(run.outputs.model_outputs) == 1
    assert len(client.search_logged_models([run.info.experiment_id])) == 1
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=first.mlflow_run_id, max_results=200,
                                  include_spans=False)
    assert len(traces) == N  # the held-out rows as evaluation traces, once each


def test_champion_moves_only_for_a_significantly_better_challenger(env, tiny_model_dir):
    cfg, store, dataset = env
    runs = {name: make_run(store, tiny_model_dir, name, correct_first(k))
            for name, k in (("weak", 10), ("strong", 30), ("marginal", 32), ("worse", 5))}

    decisions = {name: register(cfg, store, dataset, *runs[name]) for name in ("weak", "strong", "marginal", "worse")}

    assert decisions["weak"].aliases == ["champion"], "a champion is not also the challenger"
    assert decisions["strong"].decision.startswith("promoted v2 over v1")  # 20 discordant pairs, all for v2
    assert decisions["strong"].aliases == ["champion"]  # promoted: no longer (and not also) the challenger
    assert decisions["marginal"].decision.startswith("kept champion v2") and "not significantly" in \
        decisions["marginal"].decision
    assert decisions["worse"].decision.startswith("kept champion v2") and "not better" in decisions["worse"].decision
    client = MlflowClient(cfg.tracking.mlflow_uri)
    assert str(client.get_model_version_by_alias("verl-grpo-gsm8k", "champion").version) == "2"
    assert str(client.get_model_version_by_alias("verl-grpo-gsm8k", "challenger").version) == "4"
    versions = {v: client.get_model_version("verl-grpo-gsm8k", v) for v in ("2", "3", "4")}
    assert [versions[v].tags["promotion.decision"] for v in versions] == ["promoted", "kept-not-significant",
                                                                          "kept-not-better"]
    assert [versions[v].description for v in versions] == [decisions[n].decision
                                                           for n in ("strong", "marginal", "worse")]
    v2_run = client.get_run(versions["2"].run_id).data.metrics  # the comparison's numbers are on the run
    assert v2_run["promotion.challenger_only"] == 20 and v2_run["promotion.mcnemar_p"] < 1e-5
    rows = list_models(cfg)
    assert [(r["version"], r["aliases"], r["accuracy"], r["steps"]) for r in rows] == [
        (4, ["challenger"], 0.125, 3), (3, [], 0.8, 3), (2, ["champion"], 0.75, 3), (1, [], 0.25, 3)]
    assert rows[1]["decision"] == "kept-not-significant" and rows[1]["delta_accuracy"] == 0.8


def test_other_eval_settings_are_not_compared_unless_the_champion_is_re_evaluated(env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "old", correct_first(5), settings="old"))
    train, report, base = make_run(store, tiny_model_dir, "new", correct_first(35), settings="new")

    kept = register(cfg, store, dataset, train, report, base)
    assert kept.decision.startswith("kept champion v1: it was evaluated with other settings")

    champion_again = stored_report(store, "eval-cache/champ/test-new.parquet", "champ", correct_first(5), "new")
    train2, report2, _ = make_run(store, tiny_model_dir, "new2", correct_first(35), settings="new")
    promoted = register(cfg, store, dataset, train2, report2, base, champion_report=champion_again)
    assert promoted.decision.startswith("promoted v3 over v1") and "champion" in promoted.aliases


def test_reward_curve_is_a_png_beside_the_run_and_on_the_mlflow_run_with_its_table(env, tiny_model_dir, tmp_path):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10), lines=trl_lines(30, tied=True))

    version = register(cfg, store, dataset, train, report, base)

    client = MlflowClient(cfg.tracking.mlflow_uri)
    plots = {a.path for a in client.list_artifacts(version.mlflow_run_id, "plots")}
    assert plots == {"plots/accuracy_vs_base.png", "plots/reward_curve.png"}
    table = Path(client.download_artifacts(version.mlflow_run_id, "reward_curve.md", str(tmp_path))).read_text()
    assert "(30 steps, each row the mean of 2 steps)" in table
    assert "| step | reward | correctness | strict_format |" in table and "| 30 | 0.295 | 0.029 |" in table
    png = curve_png_location(store, "run-a")
    assert png == store.path("runs/run-a/reward_curve.png") and Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert curve_png_location(store, "run-never-trained") == ""


def test_a_run_without_learning_signal_says_so_in_its_decision_and_health(env, tiny_model_dir):
    cfg, store, dataset = env
    lines = trl_lines(2, tied=True) + trl_lines(5, tied=True, tied_share=1.0)[2:]  # steps 3-5: every group tied
    train, report, base = make_run(store, tiny_model_dir, "run-flat", correct_first(10), lines=lines)

    version = register(cfg, store, dataset, train, report, base)

    (finding,) = version.health
    assert finding.startswith("no learning signal for 3 consecutive steps (steps 3-5)")
    assert finding not in version.decision
    client = MlflowClient(cfg.tracking.mlflow_uri)
    description = client.get_model_version("verl-grpo-gsm8k", version.version).description
    assert description == f"{version.decision}\n\n**Warning:** {finding}"
    assert register(cfg, store, dataset, train, report, base).decision == version.decision  # a retry reads it back
    assert f"**Warning:** {finding}" in client.get_run(version.mlflow_run_id).data.tags["mlflow.note.content"]


def test_unknown_model_lists_nothing_and_an_unreachable_server_is_an_infra_error(env, monkeypatch):
    cfg, _, _ = env
    assert list_models(cfg, "no-such-model") == []
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as s:  # a port that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InfraError, match="tracking.mlflow_uri"):
        list_models(f"http://127.0.0.1:{port}", "verl-grpo-gsm8k")


def test_secret_looking_tags_are_refused(env, tiny_model_dir):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))
    with pytest.raises(ConfigError, match="hf_token"):
        register_run(outcome(cfg, dataset, train, report, base), tags={"hf_token": "abc"})


# What the MLflow UI shows, read through the API the UI reads.

def test_experiment_opens_as_model_training_also_when_it_existed(env, tiny_model_dir, tmp_path):
    cfg, store, dataset = env
    client = MlflowClient(cfg.tracking.mlflow_uri)
    # Made before experiments were marked: no kind, so the UI guesses (GenAI view).
    client.create_experiment(cfg.experiment_name, artifact_location=(tmp_path / "artifacts").as_uri())

    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "run-a", correct_first(10)))

    experiment = client.get_experiment_by_name(cfg.experiment_name)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_run_spans_the_training_and_shows_dataset_source_and_model(env, tiny_model_dir):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))
    trained_at = time.time() - 3600  # training began an hour before this registration
    store.write_text(json.dumps({"run_id": "run-a", "created_at": trained_at - 60, "training_started_at": trained_at}),
                     "runs/run-a/run.json")

    version = register(cfg, store, dataset, train, report, base)

    client = MlflowClient(cfg.tracking.mlflow_uri)
    run = client.get_run(version.mlflow_run_id)
    assert run.info.start_time == int(trained_at * 1000) and run.info.status == "FINISHED"
    assert run.info.end_time - run.info.start_time >= 3600 * 1000  # Duration: the training, not the registration
    [dataset_input] = run.inputs.dataset_inputs
    assert (dataset_input.dataset.name, dataset_input.dataset.digest) == ("gsm8k", "h1")
    assert {t.key: t.value for t in dataset_input.tags} == {"mlflow.data.context": "training"}
    assert json.loads(dataset_input.dataset.profile)["rows"] == {SPLIT: N}
    assert run.data.tags["mlflow.source.name"] == "verl-grpo" and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags.get("mlflow.source.git.commit", "") == git_sha()  # the Version column (absent outside git)
    [output] = run.outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    assert (model.source_run_id, model.status, output.step) == (run.info.run_id, LoggedModelStatus.READY, 3)
    assert {m.key: m.value for m in model.metrics}["eval.accuracy"] == 0.25  # its row in the Models tab
    [listed] = json.loads(model.tags["mlflow.modelVersions"])  # the logged model's page lists its registered version
    assert (listed["name"], str(listed["version"])) == ("verl-grpo-gsm8k", "1")
    assert client.get_model_version("verl-grpo-gsm8k", "1").source == model.artifact_location


def test_params_are_the_sections_the_run_reads(env, tiny_model_dir):
    cfg, store, dataset = env
    assert (cfg.trainer.backend, cfg.infra.provider, cfg.services.enabled) == ("trl", "local", [])

    version = register(cfg, store, dataset, *make_run(store, tiny_model_dir, "run-a", correct_first(10)))

    params = MlflowClient(cfg.tracking.mlflow_uri).get_run(version.mlflow_run_id).data.params
    assert not [k for k in params if k.startswith(("verl.", "skypilot.", "services."))]
    assert {"algorithm.rollouts", "trainer.backend", "infra.provider", "eval.limit"} <= set(params)


def test_versions_show_their_decision_few_tags_and_the_model_names_its_champion(env, tiny_model_dir):
    cfg, store, dataset = env
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "weak", correct_first(10)))
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "strong", correct_first(30)))
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "worse", correct_first(5)))

    client = MlflowClient(cfg.tracking.mlflow_uri)
    v1, v2, v3 = (client.get_model_version("verl-grpo-gsm8k", v) for v in ("1", "2", "3"))
    assert v1.description == "v1 is the first model: it becomes the champion (accuracy 0.250 on test, n=40)"
    assert v2.description.startswith("promoted v2 over v1 (accuracy 0.750 vs 0.250 on 40 problems")
    assert "McNemar p=" in v2.description and "\n" not in v2.description
    assert v3.description.startswith("kept champion v2: v3 is not better")
    for v in (v1, v2, v3):  # lineage, line, eval settings key, decision; every number is on the run
        assert set(v.tags) == {"verl_grpo.run_id", "verl_grpo.model_uri", "dataset.hash", "model.base",
                               "config.digest", "comparability", "eval.settings_key", "promotion.decision"}
    assert v1.tags["comparability"] == "dataset=gsm8k base=HuggingFaceTB/SmolLM2-135M-Instruct"
    description = client.get_registered_model("verl-grpo-gsm8k").description
    assert description.startswith("Champion: v2 (accuracy 0.750 on test, n=40, run strong). Line: smollm2-135m on "
                                  "gsm8k; only versions of that base model and dataset compete with it.\n\n")


@pytest.fixture
def mlflow_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("mlflow server did not become healthy within 90 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_register_against_an_mlflow_server(env, tiny_model_dir, mlflow_server, tmp_path):
    cfg, store, dataset = env
    cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"mlflow_uri": mlflow_server})})
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))

    version = register(cfg, store, dataset, train, report, base)
    again = register(cfg, store, dataset, train, report, base)

    assert again.version == version.version == "1"
    assert [(r["version"], r["accuracy"], r["steps"]) for r in list_models(mlflow_server, "verl-grpo-gsm8k")] == [
        (1, 0.25, 3)]
    client = MlflowClient(mlflow_server)
    run = client.get_run(version.mlflow_run_id)
    assert len(run.inputs.dataset_inputs) == len(run.outputs.model_outputs) == 1
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_model_version("verl-grpo-gsm8k", "1").description.startswith("v1 is the first model")
    hf_dir = download_version(mlflow_server, "verl-grpo-gsm8k", "1", tmp_path / "dl")
    assert AutoModelForCausalLM.from_pretrained(hf_dir).config.vocab_size > 0


def test_actual_cloud_cost_is_on_the_run_and_in_the_returned_version(env, tiny_model_dir):
    cfg, store, dataset = env
    cost = RunCost(node_hours=4.5, cost_usd=65.0, run_hours=2.03, jobs=2, recoveries=1, pricing="spot",
                   priced_at="spot runpod/US")

    version = register(cfg, store, dataset, *make_run(store, tiny_model_dir, "run-a", correct_first(10)),
                       cloud_cost=cost)

    run = MlflowClient(cfg.tracking.mlflow_uri).get_run(version.mlflow_run_id)
    assert run.data.metrics["cloud.node_hours"] == 4.5 and run.data.metrics["cloud.cost_usd"] == 65.0
    assert run.data.metrics["cloud.recoveries"] == 1 and run.data.metrics["cloud.jobs"] == 2
    assert run.data.params["cloud.pricing"] == "spot" and run.data.params["cloud.priced_at"] == "spot runpod/US"
    assert version.cloud_cost == cost


def test_a_warm_start_eval_sits_beside_base_and_trained_and_the_decision_says_what_grpo_added(env, tiny_model_dir,
                                                                                              tmp_path):
    cfg, store, dataset = env
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(16))
    warm = stored_report(store, f"eval-cache/warm_start-abc/{SPLIT}-settings-a.parquet", "warm", correct_first(4),
                         "settings-a")

    version = register(cfg, store, dataset, train, report, base, warm_start_report=warm)

    client = MlflowClient(cfg.tracking.mlflow_uri)
    metrics = client.get_run(version.mlflow_run_id).data.metrics
    assert (metrics["base.accuracy"], metrics["warm_start.accuracy"], metrics["eval.accuracy"]) == (0.0, 0.1, 0.4)
    assert metrics["delta_grpo.accuracy"] == pytest.approx(0.3)
    assert metrics["pvalue.trained_vs_warm_start.accuracy"] == pytest.approx(2 * 0.5 ** 12)  # 12 discordant, all won
    assert metrics["pvalue.warm_start_vs_base.accuracy"] == pytest.approx(0.125)  # 4 discordant
    assert metrics["pvalue.trained_vs_base.accuracy"] == pytest.approx(2 * 0.5 ** 16)
    artifacts = {a.path for a in client.list_artifacts(version.mlflow_run_id, "eval")}
    assert {"eval/test.parquet", "eval/base-test.parquet", "eval/warm_start-test.parquet",
            "eval/warm_start-test.json"} <= artifacts
    grpo = "GRPO added +0.3000 accuracy over the warm start (0.1000 -> 0.4000, McNemar p=0.000488)"
    assert version.decision.endswith(f"; {grpo}")
    assert client.get_model_version(version.name, version.version).description == version.decision
    # A run without a warm start logs none of it.
    plain = register(cfg, store, dataset, *make_run(store, tiny_model_dir, "run-b", correct_first(16)))
    plain_metrics = client.get_run(plain.mlflow_run_id).data.metrics
    assert "pvalue.trained_vs_base.accuracy" in plain_metrics
    assert not any(k.startswith(("warm_start.", "delta_grpo.", "pvalue.trained_vs_warm")) for k in plain_metrics)
    assert "GRPO added" not in plain.decision
