"""Pure parts of preparation: val carve, templates, chat messages, hashing, row assembly."""

import json

import pytest

from verl_grpo.config import DatasetConfig, RunConfig
from verl_grpo.data.prepare import (
    BUILDERS,
    build_rows,
    carve_validation,
    chat_messages,
    check_user_template,
    dataset_hash,
)
from verl_grpo.data.schema import RawRecord, Reason
from verl_grpo.errors import ConfigError, DataError


def test_carve_is_seeded_disjoint_and_order_preserving():
    rows = list(range(100))
    train, val = carve_validation(rows, 10, seed=7)
    assert len(val) == 10 and len(train) == 90
    assert sorted(train + val) == rows and train == sorted(train) and val == sorted(val)
    assert carve_validation(rows, 10, seed=7) == (train, val)
    assert carve_validation(rows, 10, seed=8)[1] != val


def test_carve_zero_and_too_large():
    assert carve_validation([1, 2, 3], 0, seed=0) == ([1, 2, 3], [])
    with pytest.raises(DataError, match="dataset.val_size"):
        carve_validation([1, 2, 3], 3, seed=0)


@pytest.mark.parametrize("template", ["{question}", "Q: {question}\nA:", "Solve {{carefully}}: {question}"])
def test_valid_templates(template):
    check_user_template(template)
    question = "2+{2}?"
    assert chat_messages("", template, question) == [{"role": "user", "content": template.format(question=question)}]


@pytest.mark.parametrize("template", ["no field", "{problem}", "{question} {extra}", "{question", "{0}"])
def test_invalid_templates_name_the_field(template):
    with pytest.raises(ConfigError, match="dataset.user_template"):
        check_user_template(template)


def test_chat_messages_system_then_user_and_empty_system_omitted():
    msgs = chat_messages("SYS", "Q: {question}", "2+{2}?")
    assert msgs == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "Q: 2+{2}?"}]
    assert chat_messages("", "{question}", "x") == [{"role": "user", "content": "x"}]


def test_hash_changes_with_every_setting():
    base = {"system_prompt": "s", "user_template": "{question}", "val_size": 5, "seed": 0, "max_prompt_length": 512,
            "tokenizer": None, "builder_version": "1"}
    h = dataset_hash("abc", base)
    assert h == dataset_hash("abc", dict(base)) and len(h) == 64
    assert dataset_hash("abd", base) != h
    for key, value in [("system_prompt", "t"), ("user_template", "Q {question}"), ("val_size", 6), ("seed", 1),
                       ("max_prompt_length", 256), ("tokenizer", "tok"), ("builder_version", "2")]:
        assert dataset_hash("abc", {**base, key: value}) != h, key


def _gsm(pos, split, question="How many?", answer="#### 3"):
    data = {"question": question, "answer": answer}
    return RawRecord(split=split, position=pos, uid=f"{split}/{pos}", raw=json.dumps(data), data=data)


def test_build_rows_assigns_index_per_split_and_quarantines():
    records = [_gsm(i, "train") for i in range(8)] + [_gsm(8, "train", answer="none"), _gsm(0, "test")]
    cfg = RunConfig(dataset=DatasetConfig(name="gsm8k", val_size=2, seed=3))
    built = build_rows(BUILDERS["gsm8k"], records, "SYS", "{question}", cfg)
    assert {k: len(v) for k, v in built.splits.items()} == {"train": 6, "val": 2, "test": 1}
    assert [r["extra_info"]["index"] for r in built.splits["train"]] == list(range(6))
    assert all(r["extra_info"]["split"] == "val" for r in built.splits["val"])
    assert [r["reason"] for r in built.rejected] == [Reason.NON_NUMERIC_ANSWER]
    assert built.length_check["checked"] is False and "no tokenizer" in built.length_check["note"]
    row = built.splits["test"][0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "gsm8k" and row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "3"}


def test_tokenizer_without_chat_template_is_a_config_error():
    from types import SimpleNamespace

    from verl_grpo.data.prepare import prompt_token_counts

    plain = SimpleNamespace(chat_template=None, name_or_path="plain-gpt2")
    with pytest.raises(ConfigError, match="no chat template"):
        prompt_token_counts(plain, [[{"role": "user", "content": "x"}]])
    assert prompt_token_counts(SimpleNamespace(chat_template=None), []) == []


def test_rows_name_verls_tool_loop_and_search_kwargs_only_with_retrieval():
    """verl's AgentLoopManager picks the loop by a row's `agent_name`; RLHFDataset hands extra_info.tools_kwargs to
    the tool loop. Without the retrieval-server the rows (and so the dataset hashes) stay as they were."""
    import pyarrow as pa

    from verl_grpo.data.schema import row_schema

    records = [_gsm(i, "train") for i in range(4)] + [_gsm(0, "test")]
    tool_cfg = RunConfig(dataset=DatasetConfig(name="gsm8k", val_size=1), services=["retrieval"])
    built = build_rows(BUILDERS["gsm8k"], records, "SYS", "{question}", tool_cfg)
    row = built.splits["train"][0]
    assert row["agent_name"] == "tool_agent"
    assert row["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {"data_source": "gsm8k"}}}
    schema = row_schema(BUILDERS["gsm8k"].extra_fields, tool_agent=True)
    table = pa.Table.from_pylist(built.splits["train"], schema=schema)  # the parquet types hold these rows
    assert table.to_pylist()[0]["extra_info"]["tools_kwargs"] == row["extra_info"]["tools_kwargs"]

    plain = build_rows(BUILDERS["gsm8k"], records, "SYS", "{question}",
                       RunConfig(dataset=DatasetConfig(name="gsm8k", val_size=1)))
    assert "agent_name" not in plain.splits["train"][0]
    assert "tools_kwargs" not in plain.splits["train"][0]["extra_info"]
    assert "agent_name" not in row_schema(BUILDERS["gsm8k"].extra_fields).names
