"""prepare_dataset end to end: the real mirror, malformed mirrors, caching, file:// and s3:// stores, the hub guard."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_grpo.config import AlgorithmConfig, DatasetConfig, RunConfig
from verl_grpo.data import load_split, prepare_dataset
from verl_grpo.data.gsm8k import BUILDER as GSM8K
from verl_grpo.data.schema import Reason
from verl_grpo.data.sources import HubSplit, read_hub_source, read_jsonl
from verl_grpo.errors import DataError
from verl_grpo.store import Store, strip_scheme

VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def run_config(name: str, **dataset) -> RunConfig:
    return RunConfig(dataset=DatasetConfig(name=name, **dataset))


def manifest_of(store: Store, version) -> dict:
    return json.loads(store.read_text(f"datasets/{version.name}/{version.hash}", "manifest.json"))


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# --- the real mirror ------------------------------------------------------------------------------------------------

EXPECTED = {
    "gsm8k": {"test": 1319, "train+val": 7473},
    "math": {"test": 500, "train+val": 7500},
    "mbpp": {"train": 374, "val": 90, "test": 500},
}


@pytest.mark.parametrize("name", ["gsm8k", "math", "mbpp"])
def test_real_mirror_counts_schema_and_cache_hit(name, data_mirror, tmp_path, caplog):
    store = Store(f"file://{tmp_path / 'store'}")
    cfg = run_config(name, val_size=150, seed=1)
    version = prepare_dataset(cfg, store)

    manifest = manifest_of(store, version)
    assert version.source == f"mirror:{data_mirror / name}"
    assert set(version.splits) >= {"train", "val", "test"}
    if "train+val" in EXPECTED[name]:
        assert version.counts["val"] == 150
        assert version.counts["train"] + version.counts["val"] + version.rejected == EXPECTED[name]["train+val"]
        assert version.counts["test"] == EXPECTED[name]["test"]
    else:
        assert {s: version.counts[s] for s in ("train", "val", "test")} == EXPECTED[name]
        assert version.counts["prompt"] == 10
    assert manifest["counts"] == version.counts and manifest["rejected"]["total"] == version.rejected
    assert manifest["length_check"]["checked"] is False
    if name == "math":  # two Hendrycks train solutions end in an empty \boxed{}: quarantined, not dropped
        assert manifest["rejected"]["by_reason"] == {"missing_boxed": 2}
    else:
        assert version.rejected == 0

    for split, uri in version.splits.items():
        table = pq.read_table(strip_scheme(uri))
        assert table.column_names == VERL_COLUMNS
        assert table.num_rows == version.counts[split]
    train = load_split(version, "train", store)
    first = train.iloc[0]
    assert first["data_source"] == name and first["ability"] == ("code" if name == "mbpp" else "math")
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["reward_model"]["style"] == "rule" and first["reward_model"]["ground_truth"]
    assert train["extra_info"].map(lambda e: e["index"]).tolist() == list(range(len(train)))
    assert train["extra_info"].map(lambda e: e["uid"]).is_unique

    manifest_path = Path(strip_scheme(version.uri)) / "manifest.json"
    mtime = manifest_path.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verl_grpo.data.prepare"):
        again = prepare_dataset(cfg, store)
    assert again == version
    assert "cache hit" in caplog.text
    assert manifest_path.stat().st_mtime_ns == mtime
    assert store.listdir("datasets", name) == [version.hash]


def test_val_carve_is_deterministic_and_hash_tracks_settings(data_mirror, tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    a = prepare_dataset(run_config("gsm8k", val_size=50, seed=3), store)
    b = prepare_dataset(run_config("gsm8k", val_size=50, seed=4), store)
    c = prepare_dataset(run_config("gsm8k", val_size=50, seed=3, user_template="Problem: {question}"), store)
    assert len({a.hash, b.hash, c.hash}) == 3
    val_a = load_split(a, "val", store)["extra_info"].map(lambda e: e["uid"]).tolist()
    val_b = load_split(b, "val", store)["extra_info"].map(lambda e: e["uid"]).tolist()
    val_c = load_split(c, "val", store)["extra_info"].map(lambda e: e["uid"]).tolist()
    assert val_a == val_c and val_a != val_b
    train_uids = set(load_split(a, "train", store)["extra_info"].map(lambda e: e["uid"]))
    assert not train_uids & set(val_a)
    assert load_split(c, "test", store)["prompt"][0][1]["content"].startswith("Problem: ")


def test_s3_store_prepare_cache_hit_and_load(data_mirror, s3_bucket, tmp_path, caplog):
    uri, endpoint = s3_bucket
    s3 = Store(uri, endpoint)
    cfg = run_config("mbpp")
    version = prepare_dataset(cfg, s3)
    assert version.uri.startswith("s3://") and version.counts["train"] == 374
    assert sorted(s3.listdir(f"datasets/mbpp/{version.hash}")) == sorted(
        ["manifest.json", "prompt.parquet", "rejected.parquet", "test.parquet", "train.parquet", "val.parquet"]
    )
    with caplog.at_level(logging.INFO, logger="verl_grpo.data.prepare"):
        assert prepare_dataset(cfg, s3) == version
    assert "cache hit" in caplog.text

    local = Store(f"file://{tmp_path / 'store'}")
    local_version = prepare_dataset(cfg, local)
    assert local_version.hash == version.hash
    assert load_split(version, "test", s3).equals(load_split(local_version, "test", local))


def test_load_split_errors_name_the_fix(data_mirror, tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    version = prepare_dataset(run_config("mbpp"), store)
    with pytest.raises(DataError, match="available: train"):
        load_split(version, "dev", store)
    Path(strip_scheme(version.splits["val"])).unlink()
    with pytest.raises(DataError, match="prepare the dataset again"):
        load_split(version, "val", store)


# --- malformed mirrors ------------------------------------------------------------------------------------------------


def _jsonl(path: Path, rows: list) -> None:
    """Rows are dicts (dumped as JSON) or raw bytes/str lines written verbatim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for row in rows:
            line = row if isinstance(row, bytes) else (row if isinstance(row, str) else json.dumps(row)).encode()
            f.write(line + b"\n")


LONG_QUESTION = "How many apples are there " + "and apples " * 600 + "?"
BAD_JSON_LINE = '{"question": "truncated'


def _gsm8k_mirror(root: Path) -> dict[str, int]:
    good = [{"question": f"Tom has {i} pens. How many?", "answer": f"He has {i}.\n#### {i:,}"}
            for i in range(995, 1015)]
    good[0]["answer"] = "He owes 3.\n#### -3"
    bad_train = [
        BAD_JSON_LINE, "not json at all", b"\xff\xfe{}", "[1, 2]", '"a string"', "42",  # invalid_json: 6
        {"answer": "#### 1"}, {"question": "", "answer": "#### 1"}, {"question": "  ", "answer": "#### 1"},
        {"question": None, "answer": "#### 1"}, {"question": 5, "answer": "#### 1"},  # missing_question: 5
        {"question": "q?"}, {"question": "q?", "answer": ""}, {"question": "q?", "answer": None},  # missing_answer: 3
        {"question": "q?", "answer": "#### five"}, {"question": "q?", "answer": "it is 4"},
        {"question": "q?", "answer": "#### 1/2"}, {"question": "q?", "answer": "#### $3"},
        {"question": "q?", "answer": "#### "}, {"question": "q?", "answer": "#### 12 dollars"},  # non_numeric: 6
        {"question": LONG_QUESTION, "answer": "#### 1"},
        {"question": LONG_QUESTION + "!", "answer": "#### 2"},  # prompt_too_long: 2
    ]
    _jsonl(root / "train.jsonl", good[:10] + bad_train[:11] + [""] + good[10:] + bad_train[11:])
    _jsonl(root / "test.jsonl", good[:5] + [{"question": "q", "answer": "n/a"}, {"question": "q", "answer": "#### x"},
                                            "{broken"])
    return {"invalid_json": 7, "missing_question": 5, "missing_answer": 3, "non_numeric_answer": 8,
            "prompt_too_long": 2}


def _tar_member(tar: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    tar.addfile(info, io.BytesIO(blob))


def _math_mirror(root: Path) -> dict[str, int]:
    root.mkdir(parents=True)
    members = {f"algebra/{i}.json": {"problem": f"Compute {i}+1.", "level": "Level 1", "type": "Algebra",
                                     "solution": f"It is $\\boxed{{{i + 1}}}$."} for i in range(12)}
    members["geometry/1.json"] = {"problem": "Nested?", "level": "Level ?", "type": "Geometry",
                                  "solution": r"So $\boxed{\frac{\sqrt{2}}{2}}$."}
    bad = {
        "number_theory/1.json": {"problem": "P", "solution": "No box at all."},
        "number_theory/2.json": {"problem": "P", "solution": "Boxed in words only: boxed{3}."},
        "number_theory/3.json": {"problem": "P", "solution": ""},
        "number_theory/4.json": {"problem": "P"},
        "number_theory/5.json": {"problem": "P", "solution": r"there are $\boxed{}$ primes"},
        "number_theory/6.json": {"problem": "P", "solution": r"$\boxed{ }$"},
        "number_theory/7.json": {"problem": "P", "solution": r"$\boxed{\frac{1}{2}$"},  # missing_boxed: 7
        "prealgebra/1.json": {"solution": r"\boxed{1}"},
        "prealgebra/2.json": {"problem": "   ", "solution": r"\boxed{1}"},  # missing_question: 2
    }
    with tarfile.open(root / "hendrycks_MATH_train.tar.gz", "w:gz") as tar:
        folder = tarfile.TarInfo("hendrycks_MATH_train/algebra")
        folder.type = tarfile.DIRTYPE  # directory entries are not rows
        tar.addfile(folder)
        for name, row in {**members, **bad}.items():
            _tar_member(tar, f"hendrycks_MATH_train/{name}", json.dumps(row, indent=4).encode())
        _tar_member(tar, "hendrycks_MATH_train/prealgebra/3.json", b"{ not json")
        _tar_member(tar, "hendrycks_MATH_train/prealgebra/4.json", b"\x89PNG\r\n")  # invalid_json: 2
    test = [{"problem": f"T{i}", "solution": f"\\boxed{{{i}}}", "answer": str(i), "subject": "Algebra", "level": 2,
             "unique_id": f"test/algebra/{i}.json"} for i in range(5)]
    _jsonl(root / "test.jsonl", test + [
        {"problem": "T", "solution": r"\boxed{1}"}, {"problem": "T", "answer": ""}, {"problem": "T", "answer": None},
        {"answer": "1"}, dict(test[0]),  # 3 missing_answer, 1 missing_question, 1 duplicate_id
    ])
    return {"missing_boxed": 7, "missing_question": 3, "invalid_json": 2, "missing_answer": 3, "duplicate_id": 1}


def _mbpp_row(task_id, **over) -> dict:
    row = {"text": f"Write a function f{task_id} that adds one.", "code": f"def f{task_id}(x):\r\n  return x + 1",
           "task_id": task_id, "test_setup_code": "",
           "test_list": [f"assert f{task_id}(1) == 2", f"assert f{task_id}(2) == 3"],
           "challenge_test_list": []}
    row.update(over)
    return row


def _mbpp_mirror(root: Path) -> dict[str, int]:
    good = [_mbpp_row(t) for t in (1, 2, 11, 12, 13, 511, 512, 601, 602, 603, 604)]
    bad = [
        _mbpp_row(0), _mbpp_row(975), _mbpp_row("605"), _mbpp_row(None),  # invalid_task_id: 4
        _mbpp_row(601), _mbpp_row(511, text="Another text"),  # duplicate_id: 2
        _mbpp_row(606, test_list=[]), _mbpp_row(607, test_list=None),
        _mbpp_row(608, test_list=[""]),  # missing_tests: 3
        _mbpp_row(609, test_list=["assert f609(1 == 2"]), _mbpp_row(610, test_list=["f610(1)"]),
        _mbpp_row(611, test_list=["assert True"]), _mbpp_row(612, challenge_test_list=["assert ("]),
        _mbpp_row(613, test_setup_code="def broken(:"), _mbpp_row(614, test_list="assert f614(1) == 2"),  # invalid: 6
        _mbpp_row(615, text=""), _mbpp_row(616, text=None),  # missing_question: 2
        '{"task_id": 617, "text": "x"', "{}}",  # invalid_json: 2
    ]
    _jsonl(root / "mbpp.jsonl", good + bad)
    return {"invalid_task_id": 4, "duplicate_id": 2, "missing_tests": 3, "invalid_tests": 6, "missing_question": 2,
            "invalid_json": 2}


MALFORMED = {"gsm8k": (_gsm8k_mirror, {"train": 18, "val": 2, "test": 5}),
             "math": (_math_mirror, {"train": 11, "val": 2, "test": 5}),
             "mbpp": (_mbpp_mirror, {"prompt": 2, "test": 3, "val": 2, "train": 4})}


def test_malformed_rows_are_quarantined_with_reasons(tmp_path, tiny_tokenizer, caplog):
    store = Store(f"file://{tmp_path / 'store'}")
    total_bad = 0
    versions = {}
    for name, (make, expected_counts) in MALFORMED.items():
        mirror = tmp_path / "mirror" / name
        expected_reasons = make(mirror)
        total_bad += sum(expected_reasons.values())
        cfg = RunConfig(dataset=DatasetConfig(name=name, mirror_dir=str(mirror), val_size=2, source="mirror"),
                        algorithm=AlgorithmConfig(max_prompt_length=256))
        with caplog.at_level(logging.WARNING, logger="verl_grpo.data.prepare"):
            version = versions[name] = prepare_dataset(cfg, store, tokenizer=tiny_tokenizer)

        assert version.counts == expected_counts, name
        manifest = manifest_of(store, version)
        assert manifest["rejected"]["by_reason"] == expected_reasons, name
        assert manifest["rejected"]["total"] == version.rejected == sum(expected_reasons.values())
        assert manifest["length_check"]["checked"] is True
        assert manifest["length_check"]["tokenizer"] == tiny_tokenizer.name_or_path
        assert f"{version.rejected} rows quarantined" in caplog.text

        rejected = pq.read_table(strip_scheme(version.uri) + "/rejected.parquet").to_pandas()
        assert Counter(rejected["reason"]) == Counter(expected_reasons)
        assert set(rejected["reason"]) <= {r.value for r in Reason}
        assert rejected["detail"].str.len().min() > 0
    assert total_bad >= 50

    gsm_version = versions["gsm8k"]
    rejected = pq.read_table(strip_scheme(gsm_version.uri) + "/rejected.parquet").to_pandas()
    assert BAD_JSON_LINE in rejected["row"].tolist()  # the original row, verbatim
    too_long = rejected[rejected["reason"] == "prompt_too_long"]
    assert len(too_long) == 2 and "algorithm.max_prompt_length=256" in too_long["detail"].iloc[0]
    assert json.loads(too_long["row"].iloc[0])["question"] == LONG_QUESTION
    test = load_split(gsm_version, "test", store)
    assert test["reward_model"].map(lambda r: r["ground_truth"]).tolist() == ["-3", "996", "997", "998", "999"]
    train = load_split(gsm_version, "train", store)
    assert "1014" in train["reward_model"].map(lambda r: r["ground_truth"]).tolist() + \
        load_split(gsm_version, "val", store)["reward_model"].map(lambda r: r["ground_truth"]).tolist()


def test_prompt_length_check_matches_the_tokenizer(data_mirror, tmp_path, tiny_tokenizer):
    store = Store(f"file://{tmp_path / 'store'}")
    cfg = RunConfig(dataset=DatasetConfig(name="mbpp"), algorithm=AlgorithmConfig(max_prompt_length=160))
    version = prepare_dataset(cfg, store, tokenizer=tiny_tokenizer)
    manifest = manifest_of(store, version)
    assert 0 < manifest["rejected"]["by_reason"]["prompt_too_long"] < 974
    assert manifest["length_check"]["max_prompt_tokens"] > 160
    for split in ("train", "val", "test"):
        for prompt in load_split(version, split, store)["prompt"]:
            ids = tiny_tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            assert len(tiny_tokenizer(ids, add_special_tokens=False)["input_ids"]) <= 160
    untokenized = prepare_dataset(RunConfig(dataset=DatasetConfig(name="mbpp")), store)
    assert untokenized.hash != version.hash


# --- sources: mirror missing, hub guard, the hub reader on a local dataset dir ---------------------------------------


def test_missing_mirror_with_source_mirror_names_the_field(tmp_path):
    cfg = run_config("gsm8k", source="mirror", mirror_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="dataset.mirror_dir") as exc:
        prepare_dataset(cfg, Store(f"file://{tmp_path / 'store'}"))
    assert "train.jsonl" in str(exc.value)


@pytest.fixture
def offline_hub(monkeypatch):
    """The real datasets/huggingface_hub code, told to stay offline so the failure is immediate."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("source", ["auto", "hub"])
def test_hub_failure_without_mirror_raises_data_error(source, tmp_path, offline_hub):
    cfg = run_config("mbpp", source=source, mirror_dir=str(tmp_path / "absent"), hub_id="verl-grpo-tests/no-such-set")
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, Store(f"file://{tmp_path / 'store'}"))
    message = str(exc.value)
    assert "dataset.mirror_dir" in message and "dataset.source" in message and "mbpp.jsonl" in message
    assert not (tmp_path / "store").exists()


def test_hub_reader_on_a_local_dataset_dir_matches_the_mirror_reader(tmp_path):
    hub_dir = tmp_path / "hub-copy"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i:,}"} for i in range(598, 603)]
    _jsonl(hub_dir / "train.jsonl", rows)
    _jsonl(hub_dir / "test.jsonl", rows[:2])
    source = read_hub_source([HubSplit(str(hub_dir), None, s, s) for s in ("train", "test")])
    assert source.description == f"hub:{hub_dir}"
    from_hub = [GSM8K.to_problem(r) for r in source.read_records()]
    from_mirror = [GSM8K.to_problem(r) for r in read_jsonl(hub_dir / "train.jsonl", "train") +
                   read_jsonl(hub_dir / "test.jsonl", "test")]
    assert [(p.uid, p.question, p.ground_truth) for p in from_hub] == [
        (p.uid, p.question, p.ground_truth) for p in from_mirror]
    assert [p.ground_truth for p in from_hub] == ["1196", "1198", "1200", "1202", "1204", "1196", "1198"]
