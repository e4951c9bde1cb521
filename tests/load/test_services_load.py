"""Load and abuse on loopback against real reward- and retrieval-server processes (bounded count and time).

N concurrent clients → zero errors, p50/p99 latency printed (and written to the `load-latency.json` of the
test's tmp dir); malformed JSON, oversized bodies, wrong tokens and unicode garbage → clean 4xx, and the
server keeps serving. No timing is asserted.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from verl_grpo.config import RunConfig
from verl_grpo.services.local_group import start_local_services, stop_local_services

CLIENTS = 16
REWARD_REQUESTS = 20
RETRIEVAL_REQUESTS = 8
MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def services(tmp_path_factory, data_mirror):
    tmp = tmp_path_factory.mktemp("load")
    data = json.loads((data_mirror / "squad" / "dev-v1.1.json").read_text())
    corpus = tmp / "squad.json"
    corpus.write_text(json.dumps({"version": "1.1", "data": data["data"][:1]}))
    cfg = RunConfig.model_validate({
        "storage": {"uri": f"file://{tmp / 'store'}"},
        "services": {"enabled": ["reward", "retrieval"], "termination_delay_s": 0, "max_body_bytes": MAX_BODY,
                     "retrieval": {"index": "load", "corpus": str(corpus)}},
    })
    group = start_local_services(cfg, "load", tmp / "work")
    token = open(group.token_file).read()
    yield group.endpoints, token, tmp
    stop_local_services(tmp / "work", delay_s=0)


def _hammer(url: str, token: str, bodies: list[dict], clients: int) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []

    def worker(chunk: list[dict]) -> None:
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
            for body in chunk:
                t = time.perf_counter()
                r = http.post(url, json=body)
                latencies.append(time.perf_counter() - t)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, [bodies[i::clients] for i in range(clients)]))
    return latencies, errors


def _report(tmp, name: str, latencies: list[float]) -> dict:
    ms = np.array(latencies) * 1000
    stats = {"requests": len(ms), "clients": CLIENTS, "p50_ms": round(float(np.percentile(ms, 50)), 1),
             "p99_ms": round(float(np.percentile(ms, 99)), 1)}
    path = tmp / "load-latency.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**report, name: stats}, indent=2))
    print(f"\n{name}: {stats}")
    return stats


def test_reward_server_under_concurrent_clients(services):
    endpoints, token, tmp = services
    items = [{"data_source": "gsm8k", "solution_str": f"<think>{i}</think><answer>{i % 7}</answer>", "ground_truth": "3"}
             for i in range(32)]
    bodies = [{"items": items[j % 4 * 8 : j % 4 * 8 + 8]} for j in range(CLIENTS * REWARD_REQUESTS)]
    latencies, errors = _hammer(f"{endpoints['reward-server']}/batch_reward", token, bodies, CLIENTS)
    assert errors == []
    assert _report(tmp, "reward-server", latencies)["requests"] == CLIENTS * REWARD_REQUESTS


def test_retrieval_server_under_concurrent_clients(services):
    endpoints, token, tmp = services
    questions = ["Who won Super Bowl 50?", "Where was the game played?", "Who was the MVP?", "What did Beyonce do?"]
    bodies = [{"queries": [questions[j % 4]], "top_k": 3} for j in range(CLIENTS * RETRIEVAL_REQUESTS)]
    latencies, errors = _hammer(f"{endpoints['retrieval-server']}/retrieve", token, bodies, CLIENTS)
    assert errors == []
    assert _report(tmp, "retrieval-server", latencies)["requests"] == CLIENTS * RETRIEVAL_REQUESTS


ABUSE = [
    ("malformed json", {"content": b'{"items": [{"data_source": "gsm8k",'}, 400),
    ("not json at all", {"content": b"\x00\x01\x02garbage"}, 400),
    ("invalid utf-8", {"content": b'{"items": [{"data_source": "\xff\xfe", "solution_str": "x"}]}'}, 400),
    ("lone surrogates", {"content": b'{"items": [{"data_source": "gsm8k", "solution_str": '
                                    b'"\\ud800\\udfff\\ud800"}]}'}, 422),
    ("wrong types", {"json": {"items": "all of them"}}, 422),
    ("deep nesting", {"content": b"[" * 5000 + b"]" * 5000}, 400),
    ("oversized body", {"content": b'{"items": [' + b" " * (MAX_BODY + 10) + b"]}"}, 413),
    ("lying content-length", {"content": b"{}", "headers": {"Content-Length": "999999999"}}, 413),
]


@pytest.mark.parametrize("service,path", [("reward-server", "/batch_reward"), ("retrieval-server", "/retrieve")])
def test_abuse_gets_clean_4xx_and_the_server_keeps_serving(services, service, path):
    endpoints, token, _ = services
    url = endpoints[service] + path
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as http:
        for name, kwargs, expected in ABUSE:
            if name == "lying content-length":
                continue  # httpx recomputes Content-Length; sent raw below
            headers = {**auth, **kwargs.get("headers", {})}
            r = http.post(url, headers=headers, **{k: v for k, v in kwargs.items() if k != "headers"})
            assert r.status_code == expected, f"{name}: {r.status_code} {r.text[:200]}"
            assert set(r.json()["error"]) == {"code", "message", "details"}, name
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic Zm9vOmJhcg=="},
                        {"Authorization": "Bearer " + "\u00e9" * 10}):
            r = http.post(url, json={}, headers={k: v.encode() for k, v in headers.items()})
            assert r.status_code == 401 and token not in r.text
        assert http.get(endpoints[service] + "/health").status_code == 200
    _raw_lying_content_length(endpoints[service], path, token)
    body = ({"items": [{"data_source": "gsm8k", "solution_str": "<answer>1</answer>", "ground_truth": "1"}]}
            if service == "reward-server" else {"queries": ["Super Bowl"], "top_k": 1})
    r = httpx.post(url, json=body, headers=auth, timeout=60)
    assert r.status_code == 200, r.text


def _raw_lying_content_length(base: str, path: str, token: str) -> None:
    import socket
    from urllib.parse import urlparse

    u = urlparse(base)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n{{}}".encode())
        reply = s.recv(4096).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
