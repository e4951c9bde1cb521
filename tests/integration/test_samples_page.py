"""The training samples page in a browser: a Prefect server on a loopback port renders the `training-samples`
markdown artifact of a run, and the rendered DOM (headless Chromium) keeps a response's `<answer>` tag and its line
breaks, the question shown once above its responses and without the chat template."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import browser
import httpx
import pytest
from ports import free_port
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_template import seed_prefect_home
from samples_view import readable_responses, sample_blocks

from verl_grpo.samples_markdown import full_text_line, samples_markdown
from verl_grpo_tasks.reporting import SAMPLES_KEY

pytestmark = pytest.mark.slow

CHATML = ("<|im_start|>system\nYou are a careful problem solver. Reason inside <think> </think>.<|im_end|>\n"
          "<|im_start|>user\nSusan has 52 cats. Bob has 4 cats. How many more cats has Susan?<|im_end|>\n"
          "<|im_start|>assistant\n")
RESPONSES = ["<think>\n52-4=48\n</think>\n<answer>48</answer>", "<think>\n52-2=50\n</think>\n<answer>52</answer>"]


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory):
    """`prefect server start` on a seeded home; its UI asks the API on the same loopback port."""
    home = seed_prefect_home(tmp_path_factory.mktemp("prefect"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_HOME": str(home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api}
    with open(home / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not _healthy(api):
            assert server.poll() is None and time.monotonic() < deadline, (home / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        with temporary_settings(updates={PREFECT_API_URL: api}):
            yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)


def _healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@flow
def _publish(markdown: str):
    return create_markdown_artifact(markdown, key=SAMPLES_KEY)


def test_the_samples_page_keeps_answer_tags_and_line_breaks(prefect_ui, tmp_path):
    samples = [{"prompt": CHATML, "response": r, "reward": 0.4000000096857548 * i, "advantage": 0.7071 - i,
                "truncated": False, "components": {"correctness": float(i == 0)}} for i, r in enumerate(RESPONSES)]
    page = samples_markdown({"step": 4, "samples": samples}, "gsm8k-run",
                            full_text_line(None, "/store/runs/gsm8k-run/samples.jsonl"))
    url = f"{prefect_ui}/artifacts/artifact/{_publish(page)}"
    dom = browser.rendered_dom(url)
    blocks = sample_blocks(dom)
    assert blocks[0] == "Susan has 52 cats. Bob has 4 cats. How many more cats has Susan?", blocks  # once, no template
    assert readable_responses(dom) == RESPONSES  # `<answer>` as text, each line break kept
    [numbers] = browser.tables(dom)
    assert numbers.column("reward") == ["0.0", "0.4"] and numbers.column("advantage") == ["0.707", "-0.293"]
    assert "samples.jsonl" in dom and "<|im_start|>" not in dom
    browser.screenshot(url, Path(tmp_path) / "samples-prefect.png")
