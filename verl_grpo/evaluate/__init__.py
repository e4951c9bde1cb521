"""Held-out evaluation: batched greedy generation (transformers on CPU, vLLM on GPU), rule-based scoring, cached
base-model results."""

from verl_grpo.evaluate.runner import EvalPlan, evaluate_cached, evaluate_model, plan_eval, run_eval, score_problems

__all__ = ["EvalPlan", "evaluate_cached", "evaluate_model", "plan_eval", "run_eval", "score_problems"]
