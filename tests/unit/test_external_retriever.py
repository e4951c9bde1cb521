"""services.retrieval.url: a Search-R1 retriever already serving answers the search tool. No retrieval-server is
started for it, on this machine or in the SkyPilot task; verl's tool (through its tool config and the trainer's env),
TRL's tool and the evaluation's all ask it in Search-R1's API, without the services' token."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from rendered_tasks import render

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import repo_root
from verl_grpo.providers.skypilot import templates
from verl_grpo.services.local_group import start_local_services
from verl_grpo.trainers.verl.overrides import SEARCH_R1_RETRIEVER_TOOL_CONFIG, tool_env, tool_overrides

URL = "http://10.0.0.5:8000/retrieve"
BRONCOS = '"Super Bowl 50"\nThe Denver Broncos won Super Bowl 50.'


def _error(*overrides: str, files: tuple[str, ...] = ("nq_hotpotqa",)) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(list(files), list(overrides), env={})
    assert "\n" not in str(err.value), err.value
    return str(err.value)


@pytest.mark.parametrize("url, says", [("ftp://10.0.0.5/retrieve", "http(s) URL"), ("10.0.0.5:8000", "http(s) URL"),
                                       ("http://me:sekret@10.0.0.5:8000/retrieve", "no credentials")])
def test_the_url_is_an_http_url_without_credentials_in_one_line(url, says):
    message = _error(f"services.retrieval.url={url}")
    assert "services.retrieval.url" in message and says in message and "sekret" not in message


def test_nq_hotpotqa_with_the_tool_needs_the_url_and_no_search_trajectories_from_our_corpus():
    assert "set services.retrieval.url to a Search-R1 retriever over wiki-18" in _error()
    cfg = load_config(["nq_hotpotqa"], [f"services.retrieval.url={URL}"], env={})
    assert cfg.services.enabled == ["retrieval"] and cfg.services.started == []
    assert cfg.skypilot.shape == "multinode" and not cfg.warm_start.enabled
    local = load_config(["nq_hotpotqa", "local"], [f"services.retrieval.url={URL}"], env={})
    assert local.warm_start.enabled and local.warm_start.search_share == 0  # format examples only
    message = _error(f"services.retrieval.url={URL}", "warm_start.search_share=0.5", files=("nq_hotpotqa", "local"))
    assert "warm_start.search_share=0.5" in message and "warm_start.enabled=false" in message
    assert load_config(["nq_hotpotqa"], ["services.enabled=[]"], env={}).services.started == []  # no tool, no URL


def test_no_retrieval_server_starts_for_it_on_this_machine(tmp_path):
    cfg = load_config(["nq_hotpotqa"], [f"services.retrieval.url={URL}"], env={})
    assert start_local_services(cfg, "run-1", tmp_path) is None and not (tmp_path / "services").exists()
    both = load_config(["gsm8k"], ["services.enabled=[reward,retrieval]", f"services.retrieval.url={URL}"], env={})
    assert both.services.started == ["reward"]


def test_the_skypilot_task_runs_no_retrieval_server_and_its_tool_config_asks_the_url():
    url = f"services.retrieval.url={URL}"
    rendered = render("job_group", {}, "services.enabled=[reward,retrieval]", url)
    tasks = list(yaml.safe_load_all(rendered.yaml))[1:]
    assert [t["name"] for t in tasks] == ["reward-server", "verl-trainer"]
    trainer = tasks[-1]
    assert "RETRIEVAL_SERVER_URL=" not in trainer["run"] and trainer["envs"]["USE_RETRIEVAL"] == "true"
    assert f"multi_turn.tool_config_path={SEARCH_R1_RETRIEVER_TOOL_CONFIG}" in trainer["run"]
    (alone,) = yaml.safe_load_all(render("multinode", {}, "services.enabled=[retrieval]", url).yaml)
    assert f"multi_turn.tool_config_path={SEARCH_R1_RETRIEVER_TOOL_CONFIG}" in alone["run"]
    cfg = load_config(["nq_hotpotqa"], [url], env={})
    # VerlTrainer.plan puts them in the trainer's env
    assert tool_env(cfg) == {"VERL_GRPO_RETRIEVAL_SERVER_URL": URL, "VERL_GRPO_SEARCH_TOP_K": "3"}
    assert tool_env(load_config(["gsm8k"], ["services.enabled=[retrieval]"], env={})) == {}
    group = load_config(["nq_hotpotqa"], [url, "skypilot.shape=job_group", "infra.provider=skypilot"], env={})
    with pytest.raises(ConfigError, match=r"holds only retrieval, served by the retriever at services\.retrieval"):
        templates.job_group_services(group)


@pytest.fixture
def retriever():
    """A Search-R1 retriever on 127.0.0.1: every request (path, Authorization header, body) is recorded."""
    seen: list[tuple[str, str | None, dict]] = []

    class SearchR1(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            hits = [{"document": {"id": "1", "contents": BRONCOS}, "score": 0.9}]
            data = json.dumps({"result": [hits for _ in body["queries"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SearchR1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve", seen
    server.shutdown()
    server.server_close()


def test_verls_trls_and_the_evals_search_ask_it_in_search_r1s_api_without_the_token(retriever, monkeypatch):
    from verl.tools.tool_registry import initialize_tools_from_config

    from verl_grpo.evaluate import eval_tools as evaluation
    from verl_grpo.trainers.trl.tools import tool_functions

    url, seen = retriever
    monkeypatch.setenv("VERL_GRPO_SERVICES_TOKEN", "the-services-token")
    cfg = load_config(["nq_hotpotqa"], [f"services.retrieval.url={url}", "services.retrieval.default_top_k=4"],
                      env={})
    for name, value in tool_env(cfg).items():  # the trainer's env, as VerlTrainer.plan gives it
        monkeypatch.setenv(name, value)
    (on_verl,) = initialize_tools_from_config(str(repo_root() / tool_overrides(cfg)[1].partition("=")[2]))
    response, _, metrics = asyncio.run(on_verl.execute("i-1", {"query": "who won super bowl 50"}))
    assert response.text == "Doc 1(Title: \"Super Bowl 50\") The Denver Broncos won Super Bowl 50."
    assert metrics == {"num_results": 1}

    monkeypatch.setattr("verl_grpo.services.local_group.start_local_services",
                        lambda *a, **k: pytest.fail("the evaluation started a retrieval-server"))
    (on_trl,) = tool_functions(cfg)
    (on_eval,) = evaluation.eval_tools(cfg)
    assert on_trl("who won super bowl 50", top_k=2) == on_eval("who won super bowl 50") == response.text
    assert on_trl.__name__ == on_eval.__name__ == "search"
    assert [path for path, _, _ in seen] == ["/retrieve"] * 3 and {auth for _, auth, _ in seen} == {None}
    assert [body for _, _, body in seen] == [
        {"queries": ["who won super bowl 50"], "topk": 4, "return_scores": True},
        {"queries": ["who won super bowl 50"], "topk": 2, "return_scores": True},
        {"queries": ["who won super bowl 50"], "topk": 4, "return_scores": True}]  # ours: default_top_k, not its own
