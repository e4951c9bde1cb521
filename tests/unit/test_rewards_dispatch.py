"""data_source dispatch, the TRL adapter's calling convention and cache, and score_file."""

import json

import pytest

from verl_grpo.rewards import DATA_SOURCES, WEIGHTS, compute_score, dataset_of, trl_adapter
from verl_grpo.rewards.score_file import score_file
from verl_grpo.rewards.trl_adapter import trl_reward_functions

GOOD = "<think>6 * 3</think>\n<answer>18</answer>"


@pytest.mark.parametrize(
    ("source", "dataset"),
    [
        ("gsm8k", "gsm8k"),
        ("openai/gsm8k", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("HuggingFaceH4/MATH-500", "math"),
        ("mbpp", "mbpp"),
        ("google-research-datasets/mbpp", "mbpp"),
    ],
)
def test_data_sources(source, dataset):
    assert dataset_of(source) == dataset


def test_unknown_data_source_names_supported_ones():
    with pytest.raises(ValueError, match=r"unknown data_source 'no_such_source'.*gsm8k.*mbpp"):
        compute_score("no_such_source", GOOD, "18")


def test_verl_signature_accepts_extra_info_and_kwargs():
    result = compute_score(data_source="openai/gsm8k", solution_str=GOOD, ground_truth="18",
                           extra_info={"index": 3}, reward_router_address=None)
    assert result["score"] == 1.0 and result["acc"] == 1.0


def test_every_source_maps_to_a_weight_table():
    assert {dataset_of(s) for s in DATA_SOURCES} == set(WEIGHTS)


def _trl_call(func, completions, truths, data_source="openai/gsm8k"):
    """The keyword arguments TRL 1.16's GRPOTrainer._calculate_rewards passes."""
    n = len(completions)
    return func(
        prompts=[[{"role": "user", "content": "q"}]] * n,
        completions=completions,
        completion_ids=[[1, 2]] * n,
        data_source=[data_source] * n,
        ability=["math"] * n,
        reward_model=[{"style": "rule", "ground_truth": t} for t in truths],
        extra_info=[{"index": i} for i in range(n)],
        trainer_state=None,
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
    )


def test_trl_functions_are_named_components_with_weights():
    from trl.trainer.utils import get_callable_name

    funcs, weights = trl_reward_functions("gsm8k")
    assert [get_callable_name(f) for f in funcs] == list(WEIGHTS["gsm8k"])
    assert weights == list(WEIGHTS["gsm8k"].values())


def test_trl_conversational_completions_and_weighted_sum():
    funcs, weights = trl_reward_functions("gsm8k")
    completions = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "<answer>7</answer>"}]]
    per_func = [_trl_call(f, completions, ["18", "18"]) for f in funcs]
    totals = [sum(w * col[i] for w, col in zip(weights, per_func)) for i in range(2)]
    assert totals[0] == pytest.approx(1.0)
    assert totals[1] == pytest.approx(compute_score("gsm8k", "<answer>7</answer>", "18")["score"])


def test_trl_scores_each_completion_once(monkeypatch):
    calls = []
    real = trl_adapter.compute_scores

    def counting(source, texts, truths):
        calls.append(len(texts))
        return real(source, texts, truths)

    monkeypatch.setattr(trl_adapter, "compute_scores", counting)
    monkeypatch.setattr(trl_adapter, "_cache", trl_adapter._ScoreCache())
    funcs, _ = trl_reward_functions("gsm8k")
    completions = [GOOD + f"<!-- {i} -->" for i in range(3)]
    for f in funcs:
        _trl_call(f, completions, ["18"] * 3)
    assert calls == [3]


def test_trl_missing_reward_model_column_is_a_data_error():
    from verl_grpo.errors import DataError

    funcs, _ = trl_reward_functions("gsm8k")
    with pytest.raises(DataError, match="reward_model"):
        funcs[0](prompts=["q"], completions=[GOOD])


def test_score_file_reports_bad_lines_and_keeps_going(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"solution_str": GOOD, "ground_truth": "18", "extra_info": {"id": 1}}),
                "{not json",
                json.dumps({"solution_str": GOOD}),
                json.dumps({"solution_str": GOOD, "ground_truth": "eighteen"}),
                json.dumps({"solution_str": "<answer>3</answer>", "ground_truth": "18"}),
            ]
        )
    )
    out = list(score_file("gsm8k", path))
    assert out[0]["score"]["score"] == 1.0 and out[0]["extra_info"] == {"id": 1}
    assert out[1]["line"] == 2 and "not valid JSON" in out[1]["error"]
    assert out[2]["line"] == 3 and "ground_truth" in out[2]["error"]
    assert out[3]["line"] == 4 and "ground_truth" in out[3]["error"]
    assert out[4]["score"]["correctness"] == 0.0


def test_score_file_unknown_dataset_or_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown data_source"):
        list(score_file("no_such_source", tmp_path / "x.jsonl"))
    from verl_grpo.errors import DataError

    with pytest.raises(DataError, match="not found"):
        list(score_file("gsm8k", tmp_path / "missing.jsonl"))


def test_trl_tool_run_completions_keep_their_think_block(tiny_model_dir):
    """With tools, TRL parses completions with the chat template's response schema, which moves <think> into
    `reasoning_content`; the rewards must still see it (thinking and format components)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response

    from verl_grpo.trainers.trl.tools import with_tool_template

    tokenizer = add_response_schema(with_tool_template(AutoTokenizer.from_pretrained(tiny_model_dir), "tiny"))

    def parsed(text: str) -> dict:
        return parse_response(tokenizer, tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"])

    answer = "<think>Doc 1 says the Broncos won.</think><answer>Denver Broncos</answer>"
    assert parsed(answer).get("reasoning_content")  # what TRL hands the reward functions
    truth = '{"target": ["Denver Broncos"]}'
    funcs, weights = trl_reward_functions("squad")
    call = parsed('<think>Look it up.</think><tool_call>\n{"name": "search", "arguments": {"query": "Super Bowl 50"}}'
                  "\n</tool_call>")
    assert call["tool_calls"] and call["content"] == ""
    single = [parsed(answer)]
    multi = [call, {"role": "tool", "name": "search", "content": "Doc 1(Title: Super Bowl 50) ..."}, parsed(answer)]
    for completion, raw in ((single, answer), (multi, "<think>Look it up.</think>" + answer)):
        per_func = [_trl_call(f, [completion], [truth], "squad") for f in funcs]
        expected = compute_score("squad", raw, truth)
        assert sum(w * col[0] for w, col in zip(weights, per_func)) == pytest.approx(expected["score"])
        assert expected["thinking"] == 1.0
    assert compute_score("squad", answer, truth)["score"] == 1.0
