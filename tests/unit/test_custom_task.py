"""dataset.name=custom: the config's checks, the user's files read into verl rows, and every bad input in one line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_grpo.config import load_config
from verl_grpo.data import builder_for
from verl_grpo.data.custom import load_source
from verl_grpo.data.prepare import build_rows
from verl_grpo.errors import ConfigError, DataError


def custom(tmp_path, *extra: str, train=None, test=None, reward: str | None = "reward.py") -> list[str]:
    """Overrides of a custom task over files in tmp_path (train.jsonl / test.jsonl written when given rows)."""
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        if rows is not None:
            (tmp_path / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    out = ["dataset.name=custom", "dataset.task=sums", f"dataset.train_files=[{tmp_path / 'train.jsonl'}]",
           f"dataset.test_files=[{tmp_path / 'test.jsonl'}]", "warm_start.enabled=false"]
    return out + ([f"reward.path={tmp_path / reward}"] if reward else []) + list(extra)


ROWS = [{"question": f"{a}+{a}?", "answer": 2 * a} for a in range(6)]


def test_a_custom_task_needs_its_name_files_and_reward(tmp_path):
    for missing, needed in (("dataset.task", "dataset.task"), ("dataset.train_files", "dataset.train_files")):
        overrides = [o for o in custom(tmp_path) if not o.startswith(missing)]
        with pytest.raises(ConfigError, match=f"dataset.name=custom needs {needed}"):
            load_config([], overrides, env={})
    with pytest.raises(ConfigError, match="set reward.path"):
        load_config([], custom(tmp_path, reward=None), env={})
    with pytest.raises(ConfigError, match="read only with dataset.name=custom"):
        load_config([], [f"dataset.train_files=[{tmp_path}/a.jsonl]"], env={})
    with pytest.raises(ConfigError, match="dataset.task.*no task name"):
        load_config([], [*custom(tmp_path), "dataset.task=My Task"], env={})
    with pytest.raises(ConfigError, match="warm_start.enabled rewrites"):
        load_config([], [*custom(tmp_path), "warm_start.enabled=true"], env={})
    with pytest.raises(ConfigError, match="neither a .py file nor a module"):
        load_config([], [*custom(tmp_path), "reward.path=not/a module"], env={})


def test_the_task_names_the_run_experiment_and_model_line(tmp_path):
    cfg = load_config(["local"], custom(tmp_path), env={})
    assert (cfg.task, cfg.experiment_name, cfg.registered_model_name) == ("sums", "verl-grpo/sums", "verl-grpo-sums")
    assert cfg.reward.path == str(tmp_path / "reward.py") and not cfg.warm_start.enabled  # local.yaml's by_dataset
    assert load_config(["local"], [*custom(tmp_path), "model.name=tiny"], env={}).registered_model_name == \
        "verl-grpo-sums-tiny"


def test_rows_become_verl_rows_scored_by_the_task_and_bad_rows_are_quarantined_with_reasons(tmp_path):
    train = [*ROWS, {"question": "", "answer": 1}, "not json", {"question": "no answer"},
             {"question": "blank answer", "answer": " "}]
    cfg = load_config([], custom(tmp_path, "dataset.val_size=2", train=train, test=ROWS[:3]), env={})
    builder = builder_for(cfg.dataset)
    built = build_rows(builder, load_source(cfg.dataset).read_records(), "SYS", "{question}", cfg)
    assert {s: len(r) for s, r in built.splits.items()} == {"train": 4, "val": 2, "test": 3}
    assert [(r["reason"], r["position"]) for r in built.rejected] == [
        ("missing_question", 6), ("invalid_json", 7), ("missing_answer", 8), ("missing_answer", 9)]
    assert "dataset.prompt_key" in built.rejected[0]["detail"]
    row = built.splits["test"][1]
    assert row["data_source"] == "sums" and row["ability"] == "custom"
    assert row["reward_model"]["ground_truth"] == "2"  # a number reaches the reward as its JSON text
    assert json.loads(row["extra_info"]["row"]) == ROWS[1]


def test_other_keys_parquet_and_file_uris(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"q": "1+1?", "a": "2"}, {"q": "2+2?", "a": "4"}]), tmp_path / "t.parquet")
    overrides = custom(tmp_path, "dataset.prompt_key=q", "dataset.answer_key=a",
                       f"dataset.train_files=[file://{tmp_path / 't.parquet'}]",
                       f"dataset.test_files=[{tmp_path / 't.parquet'}]")
    cfg = load_config([], overrides, env={})
    records = load_source(cfg.dataset).read_records()
    built = build_rows(builder_for(cfg.dataset), records, "", "{question}", cfg.model_copy(
        update={"dataset": cfg.dataset.model_copy(update={"val_size": 0})}))
    assert [r["prompt"][0]["content"] for r in built.splits["train"]] == ["1+1?", "2+2?"]


@pytest.mark.parametrize("case, message", [
    ("missing", r"dataset.train_files: .*missing.jsonl does not exist; give the path"),
    ("directory", r"dataset.train_files: .* is a directory"),
    ("suffix", r"dataset.train_files: .*rows.csv is neither JSONL .* nor parquet"),
    ("not_jsonl", r"dataset.train_files: .* holds no JSON object on any line"),
    ("bad_parquet", r"dataset.train_files: .* is not a readable parquet file"),
    ("no_prompt_key", r"dataset.prompt_key='problem': no row of dataset.train_files has that field \(fields: answer, "
                      r"question\); set dataset.prompt_key"),
    ("no_answer_key", r"dataset.answer_key='solution': no row of dataset.test_files has that field"),
    ("empty", r"dataset.train_files: the files hold no rows"),
    ("scheme", r"must be local paths, file:// or s3:// URIs"),
])
def test_a_bad_file_or_key_fails_in_one_line_naming_the_setting(tmp_path, case, message):
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    good = tmp_path / "train.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    files = {"missing": tmp_path / "missing.jsonl", "directory": tmp_path, "suffix": tmp_path / "rows.csv",
             "not_jsonl": tmp_path / "x.jsonl", "bad_parquet": tmp_path / "x.parquet", "empty": tmp_path / "e.jsonl",
             "scheme": "http://example.com/train.jsonl"}
    (tmp_path / "rows.csv").write_text("question,answer\n1+1,2\n")
    (tmp_path / "x.jsonl").write_text("question,answer\n1+1,2\n")
    (tmp_path / "x.parquet").write_text("not parquet")
    (tmp_path / "e.jsonl").write_text("\n\n")
    extra = {"no_prompt_key": ["dataset.prompt_key=problem"], "no_answer_key": ["dataset.answer_key=solution"]}
    overrides = custom(tmp_path, *extra.get(case, []))
    if case in files:
        overrides.append(f"dataset.train_files=[{files[case]}]")
    if case == "no_answer_key":  # train has the field, test has not
        good.write_text("".join(json.dumps({**r, "solution": r["answer"]}) + "\n" for r in ROWS))
    cfg = load_config([], overrides, env={})
    with pytest.raises(DataError, match=message) as raised:
        load_source(cfg.dataset)
    assert "\n" not in str(raised.value)


def test_files_on_s3_are_read_through_the_stores_endpoint(tmp_path, s3_bucket):
    import boto3

    uri, endpoint = s3_bucket
    bucket = uri.removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.put_object(Bucket=bucket, Key="rows/train.jsonl", Body="".join(json.dumps(r) + "\n" for r in ROWS).encode())
    table = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), table)
    s3.upload_file(str(table), bucket, "rows/test.parquet")
    overrides = custom(tmp_path, f"dataset.train_files=[s3://{bucket}/rows/train.jsonl]",
                       f"dataset.test_files=[s3://{bucket}/rows/test.parquet]")
    cfg = load_config([], overrides, env={})
    records = load_source(cfg.dataset, endpoint).read_records()
    assert [r.split for r in records] == ["train"] * 6 + ["test"] * 2

    missing = load_config([], [*overrides, f"dataset.test_files=[s3://{bucket}/rows/nothing.jsonl]"], env={})
    with pytest.raises(DataError, match=r"^dataset.test_files: s3://.*/rows/nothing.jsonl does not exist") as e:
        load_source(missing.dataset, endpoint)
    assert "\n" not in str(e.value)


def test_a_prompt_over_the_token_budget_is_quarantined(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    long = {"question": "How much is " + " plus ".join(["1"] * 200) + "?", "answer": 200}
    cfg = load_config([], custom(tmp_path, "dataset.val_size=0", "algorithm.max_prompt_length=64",
                                 train=[*ROWS, long], test=ROWS[:2]), env={})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    built = build_rows(builder_for(cfg.dataset), load_source(cfg.dataset).read_records(), "SYS", "{question}", cfg,
                       tokenizer)
    assert [(r["reason"], r["position"]) for r in built.rejected] == [("prompt_too_long", 6)]
    assert "over algorithm.max_prompt_length=64" in built.rejected[0]["detail"]
    assert len(built.splits["train"]) == 6
