"""`python -m verl_grpo.evaluate.vllm_runner SPEC_URI`: the held-out eval as a GPU task, generating with vLLM.

The SkyPilot eval task (infra/skypilot/eval-vllm.yaml.j2) runs this on a GPU node. The spec in the store
holds everything but secrets: the resolved run config (store URI and endpoint included), the dataset
version, the model's store URI and where the per-problem table and the EvalReport go. Planning, scoring
and aggregation are the CPU path's own (runner.plan_eval / run_eval); only generation differs:
`VLLMGenerator`. vLLM is imported when the generator is built, so this module imports without it. A run with its own
reward function (reward.path) is scored by it here too: the spec's config names where the task fetched it
(trainers.verl.node_reward), and it must import before vLLM starts.

Exit codes as the other cluster entries: 0 done, 2 the user must fix something, 75 retryable, 1 failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from verl_grpo.config import RunConfig
from verl_grpo.config.search import uses_search
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.evaluate.eval_tools import stop_eval_services
from verl_grpo.evaluate.generation import (
    Generation,
    GenerationParams,
    Generator,
    HFGenerator,
    Progress,
    check_chat_template,
    encode_prompts,
    render_prompts,
)
from verl_grpo.evaluate.models import resolve_model_dir
from verl_grpo.evaluate.runner import plan_eval, run_eval, with_run_tools, without_tools, without_tools_split
from verl_grpo.rewards.user_reward import UserReward
from verl_grpo.store import Store, filesystem_for, strip_scheme
from verl_grpo.store_layout import eval_report, eval_spec, eval_table
from verl_grpo.trainers.exits import run_entry
from verl_grpo.trainers.verl.settings import ENV_STORE_ENDPOINT

ENV_CPU_THREADS = "VERL_GRPO_EVAL_CPU_THREADS"
"""Set on a node without a GPU for vLLM (a local rehearsal's): generate with transformers on the CPU, with this many
torch threads."""
GPU_MEMORY_UTILIZATION = 0.9
GPU_DTYPE = "bfloat16"
"""vLLM's dtype on GPUs, whatever `model.dtype` (the CPU path's, float32 by default) says: verl trains and rolls out
in bf16 and its model merger writes bf16 weights, and vLLM's FlashAttention backend does not take float32 (it would
fall back to a slower backend with twice the weight and KV-cache memory)."""
"""The eval task has its GPUs to itself, so nearly all their memory (vLLM 0.24 defaults to 0.92); verl's rollouts share
theirs with training, hence verl.gpu_memory_utilization=0.6."""
_FAILED_FINISH = {"abort", "error"}
"""vLLM finish reasons of a request the engine gave up on (`error` is, by vLLM's own definition, retryable)."""


class EvalSpec(BaseModel):
    """What the GPU eval task evaluates and where it writes; no secrets (credentials come from the task's env)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    config: dict[str, Any]
    """The resolved RunConfig (`model_dump(mode="json")`): eval settings, model dtype, storage URI and endpoint."""
    dataset: DatasetVersion
    model_uri: str
    """The trained model directory in the store (`runs/{run_id}/model`)."""
    table_rel: str
    """Per-problem parquet, relative to the store root (`runs/{run_id}/eval/{split}.parquet`)."""
    report_rel: str
    """EvalReport JSON, relative to the store root (`runs/{run_id}/eval/{split}.json`)."""
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION

    def run_config(self) -> RunConfig:
        try:
            return RunConfig.model_validate(self.config)
        except ValidationError as e:
            raise ConfigError(f"the eval spec of run {self.run_id} holds a config this verl-grpo cannot read ({e}); "
                              "launch the eval with the same verl-grpo version as the cluster installs") from None


def plan_spec(cfg: RunConfig, model_uri: str, dataset: DatasetVersion, run_id: str,
              tensor_parallel_size: int = 1) -> EvalSpec:
    """The spec of a run's held-out eval on GPUs (pure)."""
    if tensor_parallel_size < 1:
        raise ConfigError(f"the vLLM eval needs at least one whole GPU, got tensor_parallel_size="
                          f"{tensor_parallel_size}; set skypilot.eval_accelerators, e.g. H100:1")
    split = cfg.eval.split
    return EvalSpec(run_id=run_id, config=cfg.model_dump(mode="json"), dataset=dataset, model_uri=model_uri,
                    table_rel=eval_table(run_id, split), report_rel=eval_report(run_id, split),
                    tensor_parallel_size=tensor_parallel_size)


def write_spec(spec: EvalSpec, store: Store) -> str:
    """Store the spec beside the run; its URI is the task's argument."""
    return store.write_text(spec.model_dump_json(indent=1), eval_spec(spec.run_id, spec.run_config().eval.split))


def read_spec(uri: str, endpoint_url: str | None = None) -> EvalSpec:
    try:
        with filesystem_for(uri, endpoint_url).open(strip_scheme(uri), "r") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"eval spec {uri} does not exist; the pipeline's evaluate step writes it before launching "
                          "the eval task — launch through verl-grpo") from None
    except OSError as e:
        raise InfraError(f"eval spec {uri}: could not read it ({type(e).__name__}: {e}); "
                         "check the store and retry") from e
    try:
        return EvalSpec.model_validate_json(text)
    except ValidationError as e:
        raise ConfigError(f"eval spec {uri} is not a verl-grpo eval spec ({e}); launch through verl-grpo") from None


class VLLMGenerator:
    """Generator on vLLM's offline engine: greedy is temperature 0, pass@k/maj@k sample `n=k` per prompt.

    Prompts go in as token ids encoded exactly like the CPU path (chat template from the model's tokenizer,
    no extra special tokens), so both backends see the same prompts.
    """

    def __init__(self, model_dir: Path, dtype: str = GPU_DTYPE, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, seed: int = 0):
        try:
            import vllm
        except ImportError as e:
            raise ConfigError("vllm is not installed here; the eval task's setup installs it (the GPU eval runs "
                              "on the skypilot provider), or use infra.provider=local for the CPU evaluator") from e
        from transformers import AutoTokenizer

        # Before the engine: a model without a chat template must not first pay vLLM's load, compile and CUDA graphs.
        check_chat_template(AutoTokenizer.from_pretrained(str(model_dir)), model_dir)
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model_dir), dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                            gpu_memory_utilization=gpu_memory_utilization, seed=seed)
        self.tokenizer = self.llm.get_tokenizer()

    def render_prompts(self, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
        return render_prompts(self.tokenizer, conversations)

    def generate(self, prompts: Sequence[str], params: GenerationParams,
                 progress: Progress | None = None) -> list[list[Generation]]:
        inputs = [{"prompt_token_ids": ids} for ids in encode_prompts(self.tokenizer, prompts)]
        outputs = self.llm.generate(inputs, self.sampling_params(params, len(prompts)), use_tqdm=True)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(prompts)} prompts")
        results = [[_generation(c) for c in out.outputs] for out in outputs]
        if progress is not None:
            progress(len(prompts), len(prompts))
        return results

    def sampling_params(self, params: GenerationParams, n_prompts: int) -> list[Any]:
        """One SamplingParams per prompt: each problem gets its own seed, so its samples do not depend on batching."""
        sp = self._vllm.SamplingParams
        if not params.do_sample:
            return [sp(n=params.samples, temperature=0.0, max_tokens=params.max_new_tokens)] * n_prompts
        return [sp(n=params.samples, temperature=params.temperature, top_p=params.top_p,
                   max_tokens=params.max_new_tokens, seed=params.seed + i) for i in range(n_prompts)]


def _generation(completion: Any) -> Generation:
    """vLLM's CompletionOutput → Generation. Its token_ids keep the end-of-sequence token (as the CPU path counts).
    finish_reason `stop` (EOS or stop token) is finished; `length` (budget exhausted) and `repetition` (vLLM cut a
    looping response) are unfinished responses that still get scored; `abort`/`error` fail the eval."""
    if completion.finish_reason in _FAILED_FINISH or completion.finish_reason is None:
        raise InfraError(f"vLLM ended a request with finish_reason={completion.finish_reason!r} instead of a "
                         "response; the eval task's retry runs it again")
    return Generation(text=completion.text, tokens=len(completion.token_ids),
                      finished=completion.finish_reason == "stop", ids=tuple(completion.token_ids))


def run_spec(spec: EvalSpec, progress: Progress | None = None) -> EvalReport:
    """Download the model, generate with vLLM, score like the CPU path, write table and report to the store.

    A run that trained with the `search` tool is evaluated with it, as on the CPU path (`runner.with_run_tools`): the
    node starts a retrieval-server of its own over the run's index (or corpus) in the store, or asks the retriever at
    services.retrieval.url, and stops it when the eval ends. Then the same model again with no tool offered (split
    `<split>-without-tools`, as `held_out.evaluate_trained_without_tools` reads it): what the tool carries."""
    cfg = node_config(spec.run_config())
    store = Store.from_config(cfg.storage)
    plan = plan_eval(cfg, spec.dataset, store)
    if isinstance(plan.scorer, UserReward):  # the run's own function, fetched to this node: before paying for vLLM
        plan.scorer.check()
    model_dir = resolve_model_dir(spec.model_uri, store)
    plain = _generator(spec, cfg, model_dir)
    try:
        report = run_eval(plan, spec.model_uri, with_run_tools(cfg, plain), store, spec.table_rel, progress=progress)
    finally:
        stop_eval_services()
    store.write_text(report.model_dump_json(indent=1), spec.report_rel)
    if uses_search(cfg):
        split = without_tools_split(cfg.eval.split)
        untooled = run_eval(plan_eval(without_tools(cfg), spec.dataset, store), spec.model_uri, plain, store,
                            eval_table(spec.run_id, split), progress=progress)
        store.write_text(untooled.model_dump_json(indent=1), eval_report(spec.run_id, split))
        print(f"eval without tools: {untooled.n} problems, {metrics_line(untooled)}", flush=True)
    return report


def node_config(cfg: RunConfig) -> RunConfig:
    """The run's config as a cluster node reads it: the retrieval corpus is the copy in the store that the launch
    published (`services.commands.retrieval_corpus_uri`), as the job group's retrieval-server reads it, not a path on
    the machine that launched."""
    if not uses_search(cfg) or cfg.services.retrieval.url:
        return cfg
    from verl_grpo.services.commands import retrieval_corpus_uri

    node = cfg.model_copy(deep=True)
    node.services.retrieval.corpus = retrieval_corpus_uri(cfg)
    return node


def _generator(spec: EvalSpec, cfg: RunConfig, model_dir: Path) -> Generator:
    """vLLM on the task's GPUs; on a node that sets ENV_CPU_THREADS transformers on the CPU instead (the only part
    stood in: planning, scoring, the table and the report are this entry point's own either way)."""
    threads = os.environ.get(ENV_CPU_THREADS)
    if threads:
        print("rehearsal: vLLM stood in by transformers generate on the CPU (same prompts, scoring and report)",
              flush=True)
        return HFGenerator(model_dir, cfg.model.dtype, threads=int(threads))
    return VLLMGenerator(model_dir, GPU_DTYPE, spec.tensor_parallel_size, spec.gpu_memory_utilization,
                         seed=cfg.eval.seed)


def metrics_line(report: EvalReport) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in sorted(report.metrics.items()))


def _print_progress(done: int, total: int) -> None:
    print(f"eval {done}/{total}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.evaluate.vllm_runner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="store URI of the eval spec (runs/<run_id>/eval/<split>-vllm-spec.json)")
    args = parser.parse_args(argv)

    def evaluate() -> None:
        spec = read_spec(args.spec, os.environ.get(ENV_STORE_ENDPOINT) or None)
        report = run_spec(spec, progress=_print_progress)
        print(f"eval done: {report.n} problems, {metrics_line(report)}; report {spec.report_rel}, table "
              f"{report.table_uri}", flush=True)

    return run_entry("vllm_runner", evaluate)


if __name__ == "__main__":
    sys.exit(main())
