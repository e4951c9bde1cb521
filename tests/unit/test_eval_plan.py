"""The one eval plan the Prefect flow's steps and the plain chain both carry out."""

from __future__ import annotations

from verl_grpo.config import load_config
from verl_grpo.eval_plan import BASE, TRAINED, TRAINED_WITHOUT_TOOLS, WARM_START, PlannedEval, eval_plan


def test_base_then_the_warm_start_the_run_had_then_the_trained_model():
    cfg = load_config([], [], env={})
    assert eval_plan(cfg, warm_start=False, without_tools_after_trained=False) == (PlannedEval(BASE),
                                                                                    PlannedEval(TRAINED))
    assert [step.name for step in eval_plan(cfg, warm_start=True, without_tools_after_trained=False)] == [
        BASE, WARM_START, TRAINED]


def test_a_run_with_the_search_tool_is_evaluated_once_more_without_it_after_the_trained_model_where_told():
    cfg = load_config([], ["services.enabled=[retrieval]"], env={})
    here = eval_plan(cfg, warm_start=False, without_tools_after_trained=False)
    assert here[-1] == PlannedEval(TRAINED_WITHOUT_TOOLS)
    on_cluster = eval_plan(cfg, warm_start=False, without_tools_after_trained=True)
    assert on_cluster[-1] == PlannedEval(TRAINED_WITHOUT_TOOLS, waits_for=(TRAINED,))
