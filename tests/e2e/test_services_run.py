"""A run with `services: [reward, retrieval]` on the local provider starts, uses and stops the services."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl_grpo import plain_steps
from verl_grpo.local_paths import data_mirror_dir, state_dir
from verl_grpo.procs import pid_alive

pytestmark = pytest.mark.e2e


def _small_corpus(tmp_path: Path) -> Path:
    """The first article of SQuAD dev (same format), so the retrieval index builds in seconds."""
    squad = json.loads((data_mirror_dir() / "squad" / "dev-v1.1.json").read_text())
    out = tmp_path / "corpus.json"
    out.write_text(json.dumps({"version": squad["version"], "data": squad["data"][:1]}))
    return out


def test_reward_server_scores_training_and_services_stop(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "services.enabled=[reward, retrieval]", "services.termination_delay_s=0",
                 f"services.retrieval.corpus={_small_corpus(tmp_path)}", "services.retrieval.index_kind=flat"]
    lines: list[str] = []
    outcome = plain_steps.run_pipeline(["gsm8k"], overrides, on_line=lines.append)

    assert "rewards: scored by the reward-server" in lines
    services = state_dir() / "work" / outcome.run.run_id / "services"
    reward_log = (services / "reward-server.log").read_text()
    assert reward_log.count("POST /batch_reward") >= outcome.train.final_step  # one request per training step
    assert "/health" in (services / "retrieval-server.log").read_text()

    metrics = [json.loads(line) for line in (Path(outcome.train.metrics_uri.removeprefix("file://"))).read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all("rewards/correctness/mean" in m for m in metrics)

    # Stopped after training: the record is gone and every server process has exited.
    assert not (services / "services.json").exists()
    for log in ("reward-server.log", "retrieval-server.log"):
        text = (services / log).read_text()
        pids = [int(p) for p in re.findall(r"Started server process \[(\d+)\]", text)]
        assert pids, f"{log} does not show a server start"
        assert not any(pid_alive(pid) for pid in pids)

