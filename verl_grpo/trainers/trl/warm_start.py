"""The warm start: a short SFT phase (TRL's SFTTrainer) on rewritten train solutions, run before GRPO.

It runs inside the training job, on the machine GRPO runs on, with the same data and model, and its model is
committed to the store (`runs/{run_id}/warm_start/`, `result.json` last) before GRPO starts: a retried or resumed
attempt fetches that model instead of training it again. An attempt cut short inside the phase (minutes long)
runs the phase again from the base model.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, TrainerCallback

from verl_grpo.data.warm_start import SftExample, select_examples
from verl_grpo.store_layout import METRICS_FILE, WARM_START_RESULT, warm_start_dir, warm_start_result
from verl_grpo.trainers.atomic_files import write_json_atomic, write_jsonl_atomic
from verl_grpo.trainers.precision import resolve_precision
from verl_grpo.trainers.trl.callbacks import say
from verl_grpo.trainers.worker.spec import WorkerSpec
from verl_grpo.trainers.worker.termination import Termination

LOSS_WINDOW = 5
"""first_loss / final_loss are the means of this many steps at each end of the phase."""
LINE_PREFIX = "warm-start"
"""Its progress lines (`warm-start k/N loss=…`) differ from GRPO's `step k/N` lines on purpose."""


def warm_started_model(spec: WorkerSpec, base_model: Path | str, termination: Termination) -> tuple[Path | None, dict]:
    """The warm-started model dir (trained now, or fetched when a previous attempt committed it) and its summary
    figures; (None, {}) when warm_start is off."""
    if not spec.cfg.warm_start.enabled:
        return None, {}
    store, local = spec.store, spec.workdir / "warm_start"
    committed = warm_start_result(spec.run_id)
    if result := committed_result(spec):
        model = store.get_dir(local / "model", warm_start_dir(spec.run_id), "model")
        say(f"{LINE_PREFIX}: reusing the committed warm start of run {spec.run_id} ({result['steps']} steps, "
            f"final loss {result['final_loss']:.4g})")
        return model, summary_of(result)
    result = train_warm_start(spec, base_model, local)
    with termination.upload():
        store.put_dir(local / "model", warm_start_dir(spec.run_id), "model")
        store.put_file(local / METRICS_FILE, warm_start_dir(spec.run_id), METRICS_FILE)
        store.write_text(json.dumps(result, indent=1), committed)
    say(f"{LINE_PREFIX}: committed to {store.url(warm_start_dir(spec.run_id))}")
    return local / "model", summary_of(result)


def committed_result(spec: WorkerSpec) -> dict[str, Any] | None:
    """The warm start a previous attempt of this run committed, if any."""
    committed = warm_start_result(spec.run_id)
    return json.loads(spec.store.read_text(committed)) if spec.store.exists(committed) else None


def summary_of(result: dict[str, Any]) -> dict[str, float]:
    return {f"warm_start_{k}": float(result[k]) for k in ("steps", "examples", "first_loss", "final_loss", "seconds")}


def examples_for(spec: WorkerSpec, tokenizer, count: int | None = None) -> list[SftExample]:
    """`count` (default steps × batch_size) train solutions (seeded order) that fit the response budget and score
    full marks."""
    from verl_grpo.data.prepare import load_split
    from verl_grpo.rewards.scoring import compute_scores

    cfg = spec.cfg
    count = cfg.warm_start.steps * cfg.warm_start.batch_size if count is None else count
    if count == 0:
        return []
    budget = cfg.warm_start.max_response_tokens or cfg.algorithm.max_response_length
    rows = load_split(spec.dataset, "train", spec.store).to_dict("records")
    random.Random(cfg.algorithm.seed).shuffle(rows)
    for row in rows:
        row["prompt"] = [dict(m) for m in row["prompt"]]
    eos = 1  # the chat template's end-of-turn token closes every response
    return select_examples(
        cfg.dataset.name, rows, count,
        fits=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) + eos <= budget,
        score=lambda texts, truths: compute_scores(cfg.dataset.name, texts, truths))


def sft_rows(spec: WorkerSpec, tokenizer) -> tuple[list[dict[str, Any]], str]:
    """The SFT dataset (prompt/completion chat rows, seeded order). With the search tool, `warm_start.search_share`
    of them are Search-R1 trajectories over the retrieval corpus, and every row carries the tool list, so the
    prompts render as GRPO's rollouts see them (the tokenizer gets a tool-calling template first). Also what the
    rows are, in words."""
    from verl_grpo.trainers.trl.tools import tool_functions, tool_schemas, with_tool_template

    cfg, ws = spec.cfg, spec.cfg.warm_start
    total = ws.steps * ws.batch_size
    tools = tool_functions(cfg)
    searches = round(total * ws.search_share) if tools else 0
    examples = examples_for(spec, tokenizer, total - searches)
    rows: list[dict[str, Any]] = [{"prompt": ex.prompt, "completion": [{"role": "assistant", "content": ex.response}]}
                                  for ex in examples]
    if tools:
        with_tool_template(tokenizer, cfg.model.name)
        trajectories = search_examples(spec, searches)
        rows += [{"prompt": ex.prompt, "completion": [ex.completion]} for ex in trajectories]
        random.Random(cfg.algorithm.seed).shuffle(rows)
        schemas = tool_schemas(tools)
        rows = [{**row, "tools": schemas} for row in rows]
        return rows, (f"{len(examples)} rewritten {cfg.dataset.name} train solutions + {len(trajectories)} "
                      "Search-R1 turns over the retrieval corpus")
    return rows, f"{len(examples)} rewritten {cfg.dataset.name} train solutions"


def search_examples(spec: WorkerSpec, count: int):
    """Search-R1 turns from the retrieval-server's corpus (services.retrieval.corpus), with the run's system prompt."""
    from verl_grpo.data.search_r1 import trajectories
    from verl_grpo.formats import default_system_prompt
    from verl_grpo.services.retrieval_index import load_squad
    from verl_grpo.services.search import clip_result, format_passages

    cfg = spec.cfg
    passages, questions = load_squad(cfg.services.retrieval.corpus)
    if cfg.dataset.name == "squad":  # the run's own task: only its train split's questions, never a held-out one
        from verl_grpo.data.prepare import load_split

        rows = load_split(spec.dataset, "train", spec.store)
        train = {str(extra["question"]).strip() for extra in rows["extra_info"]}
        questions = [q for q in questions if q.question.strip() in train]
    system = default_system_prompt(cfg.dataset.name) if cfg.dataset.system_prompt is None else cfg.dataset.system_prompt
    max_chars = cfg.services.retrieval.max_result_chars
    return trajectories(passages, questions, count, system, lambda hits: clip_result(format_passages(hits), max_chars),
                        seed=cfg.algorithm.seed, query=cfg.warm_start.search_query)


class _Lines(TrainerCallback):
    """`warm-start k/N loss=… s/step=…` per logged step, and metrics.jsonl."""

    def __init__(self, path: Path, total: int):
        self.path, self.total, self.records = path, total, []
        self.last = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        now = time.perf_counter()
        record = {"step": state.global_step, "loss": float(logs["loss"]), "step_time": now - self.last}
        if "mean_token_accuracy" in logs:
            record["mean_token_accuracy"] = float(logs["mean_token_accuracy"])
        self.last = now
        self.records.append(record)
        write_jsonl_atomic(self.path, self.records)
        say(f"{LINE_PREFIX} {state.global_step}/{self.total} loss={record['loss']:.4g} "
            f"s/step={record['step_time']:.3g}")


def train_warm_start(spec: WorkerSpec, base_model: Path | str, local: Path) -> dict[str, Any]:
    """SFT the base model on the rewritten solutions; returns the phase's result record."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from verl_grpo.models import load_model_and_tokenizer

    cfg, ws = spec.cfg, spec.cfg.warm_start
    started = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(base_model, cfg.model.dtype)
    rows, described = sft_rows(spec, tokenizer)
    steps = min(ws.steps, -(-len(rows) // ws.batch_size))
    say(f"{LINE_PREFIX}: {steps} SFT steps on {described} (lr {ws.lr:g}, {ws.batch_size} per step)")
    dataset = Dataset.from_list(rows)
    budget = ws.max_response_tokens or cfg.algorithm.max_response_length
    args = SFTConfig(
        output_dir=str(local / "trainer"), max_steps=steps, per_device_train_batch_size=ws.batch_size,
        gradient_accumulation_steps=1, learning_rate=ws.lr, lr_scheduler_type="constant", warmup_steps=0,
        seed=cfg.algorithm.seed, data_seed=cfg.algorithm.seed,
        # A Search-R1 answer turn's prompt holds the retrieved passage: no cut that could drop the answer after it.
        max_length=None if rows and "tools" in rows[0] else cfg.algorithm.max_prompt_length + budget,
        completion_only_loss=True, packing=False, logging_strategy="steps", logging_steps=1, save_strategy="no",
        report_to=[], disable_tqdm=True, use_cpu=not _cuda(), fp16=False, dataloader_num_workers=0,
        bf16=resolve_precision(cfg.trainer.precision, use_cpu=not _cuda()) == "bf16",
        # SFTConfig turns it on by default; as in GRPO (backend.py), the small models this phase trains fit without
        # it, and recomputing activations would only add time to every step.
        gradient_checkpointing=False,
    )
    lines = _Lines(local / METRICS_FILE, steps)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[lines])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_model(str(local / "model"))
    tokenizer.save_pretrained(str(local / "model"))
    losses = [r["loss"] for r in lines.records] or [float("nan")]
    window = max(1, min(LOSS_WINDOW, len(losses) // 2))  # one batch's loss is noisy; compare the ends' means
    result = {"steps": steps, "examples": len(rows), "first_loss": sum(losses[:window]) / window,
              "final_loss": sum(losses[-window:]) / window,
              "seconds": time.perf_counter() - started, "lr": ws.lr, "batch_size": ws.batch_size,
              "max_response_tokens": budget}
    write_json_atomic(local / WARM_START_RESULT, result)
    return result


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
