"""Held-out evaluation: batched greedy generation (transformers on CPU, vLLM on GPU), rule-based scoring, cached
base-model results."""

from verl_grpo.evaluate.runner import (
    EvalPlan,
    EvalShard,
    evaluate_cached,
    evaluate_model,
    evaluate_shard,
    plan_eval,
    run_eval,
    score_problems,
    write_run_report,
)

__all__ = ["EvalPlan", "EvalShard", "evaluate_cached", "evaluate_model", "evaluate_shard", "plan_eval", "run_eval",
           "score_problems", "write_run_report"]
