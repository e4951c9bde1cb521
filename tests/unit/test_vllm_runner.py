"""The vLLM eval runner end to end on CPU: spec → (fake) vLLM generation → the CPU path's scoring → table, report.

vLLM cannot run here, so a fake `vllm` module is injected through sys.modules. It keeps vLLM's call shapes
(LLM(model=..., dtype=..., tensor_parallel_size=..., gpu_memory_utilization=..., seed=...), get_tokenizer(),
generate(prompts, sampling_params, use_tqdm=...) → RequestOutput-like objects with CompletionOutput-like
`outputs`) and answers from a script keyed by the problem in the prompt. Everything around generation is real:
the store, the spec file, the tiny model's tokenizer and chat template, plan_eval, the GSM8K scorer, metrics.
"""

from __future__ import annotations

import json
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import pandas as pd
import pytest
from test_external_retriever import retriever  # noqa: F401 - a fixture
from transformers import AutoTokenizer

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.evaluate import evaluate_model, vllm_runner
from verl_grpo.store import Store
from verl_grpo.store_layout import model_dir

GOLD = {"q0": "5", "q1": "12", "q2": "7"}
BUDGET = 32
RAMBLE = "Let me think about this for a very long time without ever reaching any conclusion at all. " * 8


def right(gold: str) -> str:
    return f"<think>I work it out.</think><answer>{gold}</answer>"


def greedy_script(key: str) -> tuple[str, str]:
    """(text, finish_reason): q0, q1 answered right; q2 rambles until the budget runs out."""
    return (RAMBLE, "length") if key == "q2" else (right(GOLD[key]), "stop")


def sampled_script(key: str) -> list[str]:
    """4 samples: q0 all right; q1 two right then two wrong (a 2-2 vote tie); q2 all wrong."""
    return {"q0": [right("5")] * 4, "q1": [right("12")] * 2 + [right("3")] * 2, "q2": [right("1")] * 4}[key]


class FakeSamplingParams:
    """The SamplingParams fields the runner sets (unknown keywords fail, as vLLM's would)."""

    def __init__(self, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 16,
                 seed: int | None = None):
        self.n, self.temperature, self.top_p, self.max_tokens, self.seed = n, temperature, top_p, max_tokens, seed


class FakeLLM:
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, *, dtype: str, tensor_parallel_size: int, gpu_memory_utilization: float,
                 seed: int):
        self.kwargs = {"model": model, "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
                       "gpu_memory_utilization": gpu_memory_utilization, "seed": seed}
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.calls: list[tuple[list[list[int]], list[FakeSamplingParams]]] = []
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts, sampling_params, *, use_tqdm: bool = True):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.calls.append(([p["prompt_token_ids"] for p in prompts], params))
        outputs = []
        for prompt, sp in zip(prompts, params, strict=True):
            text = self.tokenizer.decode(prompt["prompt_token_ids"])
            key = next(k for k in GOLD if f"({k})" in text)
            if sp.temperature == 0:
                completions = [self._completion(*greedy_script(key), sp.max_tokens)]
            else:
                completions = [self._completion(t, "stop", sp.max_tokens) for t in sampled_script(key)[: sp.n]]
            outputs.append(SimpleNamespace(request_id=str(len(outputs)), prompt=None, outputs=completions,
                                           finished=True))
        return outputs

    def _completion(self, text: str, finish_reason: str, max_tokens: int):
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if finish_reason == "length":
            ids = ids[:max_tokens]
            text = self.tokenizer.decode(ids)
        else:
            ids = ids + [self.tokenizer.eos_token_id]  # vLLM keeps the EOS id in token_ids, not in text
        return SimpleNamespace(index=0, text=text, token_ids=tuple(ids), cumulative_logprob=None, logprobs=None,
                               finish_reason=finish_reason, stop_reason=None)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = ModuleType("vllm")
    module.__spec__ = ModuleSpec("vllm", None)  # what importlib.util.find_spec gives for a package (TRL asks it)
    module.LLM = FakeLLM
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.instances = []
    return module


def write_dataset(store: Store, tmp: Path) -> DatasetVersion:
    rows = [{"data_source": "gsm8k", "ability": "math",
             "prompt": [{"role": "system", "content": "Reason, then <answer></answer>."},
                        {"role": "user", "content": f"A question ({key})?"}],
             "reward_model": {"style": "rule", "ground_truth": gold},
             "extra_info": {"uid": f"test/{i}", "index": i, "split": "test"}}
            for i, (key, gold) in enumerate(GOLD.items())]
    local = tmp / "test.parquet"
    pd.DataFrame(rows).to_parquet(local, index=False)
    uri = store.put_file(local, "datasets/gsm8k/h1/test.parquet")
    return DatasetVersion(name="gsm8k", hash="h1", uri=store.url("datasets/gsm8k/h1"), splits={"test": uri},
                          counts={"test": len(rows)})


def config(store: Store, **eval_settings) -> RunConfig:
    return RunConfig.model_validate({"storage": {"uri": store.uri, "endpoint_url": store.endpoint_url},
                                     "dataset": {"name": "gsm8k"},
                                     "eval": {"limit": None, "max_new_tokens": BUDGET, **eval_settings}})


@pytest.fixture
def stored(tmp_path, tiny_model_dir):
    store = Store(f"file://{tmp_path / 'store'}")
    return store, write_dataset(store, tmp_path), store.put_dir(tiny_model_dir, model_dir("run-1"))


def test_spec_to_report_generates_with_vllm_and_scores_like_the_cpu_path(fake_vllm, stored, capsys):
    store, dataset, model_uri = stored
    cfg = config(store, samples=4, temperature=0.7, top_p=0.9, seed=3)
    spec_uri = vllm_runner.write_spec(vllm_runner.plan_spec(cfg, model_uri, dataset, "run-1", tensor_parallel_size=2),
                                      store)
    assert spec_uri == store.url("runs/run-1/eval/test-vllm-spec.json")

    assert vllm_runner.main([spec_uri]) == 0

    report = EvalReport.model_validate_json(store.read_text("runs/run-1/eval/test.json"))
    assert (report.model_uri, report.split, report.n) == (model_uri, "test", 3)
    assert report.table_uri == store.url("runs/run-1/eval/test.parquet")
    m = report.metrics
    assert (m["accuracy"], m["format_rate"], m["truncated_rate"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3),
                                                                      pytest.approx(1 / 3))
    assert m["pass@1"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert m["pass@2"] == pytest.approx((1 + (1 - 1 / 6) + 0) / 3)  # q1: 1 - C(2,2)/C(4,2)
    assert (m["pass@4"], m["maj@4"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))  # tie → first sample's answer

    (llm,) = FakeLLM.instances
    tok = llm.tokenizer
    assert llm.kwargs == {"model": str(Path(model_uri.removeprefix("file://"))), "dtype": "bfloat16",
                          "tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "seed": 3}
    (greedy_prompts, greedy_params), (sampled_prompts, sampled_params) = llm.calls
    table = pd.read_parquet(report.table_uri.removeprefix("file://"))
    # The prompts vLLM got are the table's prompts, encoded without a second BOS, in problem order.
    assert greedy_prompts == sampled_prompts == [tok(p, add_special_tokens=False)["input_ids"] for p in table["prompt"]]
    assert [(p.n, p.temperature, p.max_tokens) for p in greedy_params] == [(1, 0.0, BUDGET)] * 3
    assert [(p.n, p.temperature, p.top_p, p.max_tokens, p.seed) for p in sampled_params] == [
        (4, 0.7, 0.9, BUDGET, 3), (4, 0.7, 0.9, BUDGET, 4), (4, 0.7, 0.9, BUDGET, 5)]

    assert table["id"].tolist() == ["test/0", "test/1", "test/2"]
    assert table["correct"].tolist() == [True, True, False]
    assert table["finished"].tolist() == [True, True, False]
    assert table["response_tokens"].tolist() == [len(tok(right(g), add_special_tokens=False)["input_ids"]) + 1
                                                 for g in ("5", "12")] + [BUDGET]
    assert table["sampled_correct"].tolist() == [4, 2, 0]
    assert "eval done: 3 problems" in capsys.readouterr().out


def test_vllm_table_has_the_cpu_tables_columns_and_prompts(fake_vllm, stored):
    store, dataset, model_uri = stored
    cfg = config(store, max_new_tokens=2)
    cpu = evaluate_model(cfg, model_uri, dataset, store, out_rel="t/cpu.parquet", progress=lambda *_: None)
    gpu = vllm_runner.run_spec(vllm_runner.plan_spec(cfg, model_uri, dataset, "run-1"))
    cpu_table, gpu_table = (pd.read_parquet(r.table_uri.removeprefix("file://")) for r in (cpu, gpu))
    assert list(gpu_table.columns) == list(cpu_table.columns)
    assert gpu_table["prompt"].tolist() == cpu_table["prompt"].tolist()  # one chat rendering for both backends
    assert (gpu.settings_key, set(gpu.metrics)) == (cpu.settings_key, set(cpu.metrics))


def test_without_vllm_installed_the_generator_names_the_fix(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match="vllm is not installed"):
        vllm_runner.VLLMGenerator(tiny_model_dir)


def test_a_model_without_a_chat_template_is_refused_before_the_engine_starts(fake_vllm, tiny_model_dir, tmp_path):
    import shutil

    bare = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, bare)
    for name in ("tokenizer_config.json",):
        config = json.loads((bare / name).read_text())
        config.pop("chat_template", None)
        (bare / name).write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="no chat template"):
        vllm_runner.VLLMGenerator(bare)
    assert FakeLLM.instances == [], "no vLLM engine was built for a model it cannot evaluate"


def test_missing_or_foreign_spec_exits_with_the_user_error_code(tmp_path, capsys):
    assert vllm_runner.main([f"file://{tmp_path}/nope.json"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"run_id": "r"}))
    assert vllm_runner.main([f"file://{tmp_path}/bad.json"]) == 2
    assert "not a verl-grpo eval spec" in capsys.readouterr().err


def test_spec_holds_no_secrets_and_rejects_zero_gpus(monkeypatch, stored):
    store, dataset, model_uri = stored
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekret-aws")
    spec = vllm_runner.plan_spec(config(store), model_uri, dataset, "run-1")
    assert "sekret-aws" not in spec.model_dump_json()
    with pytest.raises(ConfigError, match="whole GPU"):
        vllm_runner.plan_spec(config(store), model_uri, dataset, "run-1", tensor_parallel_size=0)


@pytest.mark.parametrize(("reason", "finished"), [("stop", True), ("length", False), ("repetition", False)])
def test_finish_reasons_map_to_finished(reason, finished):
    completion = SimpleNamespace(text="t", token_ids=(1, 2, 3), finish_reason=reason)
    assert vllm_runner._generation(completion) == vllm_runner.Generation("t", 3, finished, ids=(1, 2, 3))


@pytest.mark.parametrize("reason", ["abort", "error", None])
def test_requests_vllm_gave_up_on_fail_the_eval_retryably(reason):
    with pytest.raises(InfraError, match="finish_reason"):
        vllm_runner._generation(SimpleNamespace(text="", token_ids=(), finish_reason=reason))


CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "who won super bowl 50"}}\n</tool_call>'


class SearchingLLM(FakeLLM):
    """Calls `search` first; once the prompt holds the tool's result, answers right."""

    def generate(self, prompts, sampling_params, *, use_tqdm: bool = True):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.calls.append(([p["prompt_token_ids"] for p in prompts], params))
        outputs = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt["prompt_token_ids"])
            key = next(k for k in GOLD if f"({k})" in text)
            reply = right(GOLD[key]) if "<tool_response>" in text else CALL
            outputs.append(SimpleNamespace(request_id=str(len(outputs)), prompt=None, finished=True,
                                           outputs=[self._completion(reply, "stop", params[0].max_tokens)]))
        return outputs


def test_a_run_that_trained_with_search_is_evaluated_with_it_on_the_vllm_node(
        fake_vllm, stored, retriever, monkeypatch):  # noqa: F811 - retriever: the fixture imported above
    url, seen = retriever
    monkeypatch.setattr(fake_vllm, "LLM", SearchingLLM)
    store, dataset, model_uri = stored
    cfg = RunConfig.model_validate({**config(store, max_new_tokens=64).model_dump(mode="json"),
                                    "services": {"enabled": ["retrieval"], "retrieval": {"url": url}}})
    report = vllm_runner.run_spec(vllm_runner.plan_spec(cfg, model_uri, dataset, "run-1"))

    assert (report.metrics["tool_use_rate"], report.metrics["accuracy"]) == (1.0, 1.0)
    assert [body["queries"] for _, _, body in seen] == [["who won super bowl 50"]] * 3  # the retriever answered
    (llm,) = SearchingLLM.instances
    (first, _), (second, params), (untooled, _) = llm.calls
    assert len(first) == len(second) == len(untooled) == 3
    resumed = [llm.tokenizer.decode(ids) for ids in second]
    # The second turn goes on from the call, with the retriever's passage as the tool's result
    assert all(CALL in text and 'Doc 1(Title: "Super Bowl 50") The Denver Broncos' in text for text in resumed)
    table = pd.read_parquet(report.table_uri.removeprefix("file://"))
    assert table["tool_calls"].tolist() == [1, 1, 1]
    # ... and once more with no tool offered, the report the pipeline reads as the trained model without tools
    assert not any("search" in llm.tokenizer.decode(ids) for ids in untooled)
    plain = EvalReport.model_validate_json(store.read_text("runs/run-1/eval/test-without-tools.json"))
    assert plain.n == 3 and plain.metrics["accuracy"] == 0.0 and "tool_use_rate" not in plain.metrics
    assert plain.settings_key != report.settings_key
