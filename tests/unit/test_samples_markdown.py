"""The training samples page Prefect shows: the question once per prompt group (not the chat template), each
response in a code block that keeps its tags and line breaks, numbers rounded, and where the full text is."""

from __future__ import annotations

from verl_grpo.formats import question_of
from verl_grpo.samples_markdown import WRAP_COLUMNS, fenced, full_text_line, number, samples_markdown

CHATML = ("<|im_start|>system\nYou are a careful problem solver. Answer inside <answer> </answer>.<|im_end|>\n"
          "<|im_start|>user\nSusan has 52 cats.\nBob has 4 cats. How many more?<|im_end|>\n<|im_start|>assistant\n")
RESPONSE = "<think>\n52-4=48\n</think>\n<answer>48</answer>"


def _sample(prompt: str, response: str = RESPONSE, reward: float = 0.4000000096857548, **kw) -> dict:
    return {"prompt": prompt, "response": response, "reward": reward, "advantage": 1.1547005383792515,
            "truncated": False, "components": {"correctness": 1.0, "strict_format": 0.5}} | kw


def test_the_question_comes_out_of_the_chat_template():
    assert question_of(CHATML) == "Susan has 52 cats.\nBob has 4 cats. How many more?"
    llama = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert question_of(llama) == "What is 2+3?"
    assert question_of("  What is 2+3?\n") == "What is 2+3?"  # a plain prompt: as is
    assert question_of("<|im_start|>user\nA question cut before its end … [80 more chars]") == \
        "A question cut before its end … [80 more chars]"
    # several user turns (a multi-turn prompt): the last one is the question
    assert question_of("<|im_start|>user\nfirst<|im_end|><|im_start|>assistant\nok<|im_end|>"
                       "<|im_start|>user\nsecond<|im_end|>") == "second"


def test_each_prompt_group_shows_its_question_once_and_its_responses_under_it():
    record = {"step": 4, "samples": [_sample(CHATML), _sample(CHATML, "other\nresponse", 0.0),
                                     _sample("plain question?", "x")]}
    page = samples_markdown(record, "gsm8k-run", full_text_line("http://mlflow/#/runs/1", "/store/samples.jsonl"))
    assert page.startswith("# Rollouts of training step 4\n")
    assert page.count("## Prompt ") == 2 and "## Prompt 1 of 2" in page and "## Prompt 2 of 2" in page
    assert page.count("Susan has 52 cats.") == 1 and "<|im_start|>" not in page and "You are a careful" not in page
    assert "```text\n" + RESPONSE + "\n```" in page  # tags and line breaks inside a code block
    assert "```text\nother\nresponse\n```" in page
    first = page.split("## Prompt 2")[0]
    assert first.index("Susan has 52 cats") < first.index("**Response 1**") < first.index("**Response 2**")
    assert "| response | reward | advantage | truncated | correctness | strict_format |" in page
    assert "| 1 | 0.4 | 1.155 | no | 1.0 | 0.5 |" in page and "0.4000000096857548" not in page
    assert "**Response 1** · reward 0.4 · advantage 1.155" in page
    assert "[the MLflow run](http://mlflow/#/runs/1), artifact `train/samples.json`" in page
    assert "`/store/samples.jsonl`" in page


def test_a_fence_inside_the_text_cannot_close_the_block():
    code = "<think>x</think>\n<answer>\n```python\ndef f():\n    return 1\n```\n</answer>"
    block = fenced(code)
    assert block.startswith("````text\n") and block.endswith("\n````") and code in block
    assert fenced("no fence").startswith("```text\n")


def test_long_lines_wrap_and_keep_their_breaks():
    text = "word " * 60 + "\n    indented " + "y" * 250
    lines = fenced(text).split("\n")[1:-1]
    assert max(len(line) for line in lines) <= WRAP_COLUMNS
    assert " ".join(lines).split().count("word") == 60 and "".join(lines).count("y") == 250
    start = next(i for i, line in enumerate(lines) if "indented" in line)  # its line break and indentation kept
    assert lines[start - 1].endswith("word") and all(line.startswith("    ") for line in lines[start:])


def test_numbers_round_to_three_digits():
    assert [number(v) for v in (0.4000000096857548, -1.1547005, 2, None, True)] == ["0.4", "-1.155", "2.0", "-",
                                                                                     "yes"]
    assert full_text_line(None, "s3://b/runs/r/samples.jsonl").startswith("**Full text** of every sampled step: "
                                                                           "the MLflow run, ")
