"""The prepared parquet is what verl's own RLHFDataset reads: same columns, same prompt-length filter."""

from __future__ import annotations

import pytest

from verl_grpo.config import AlgorithmConfig, DatasetConfig, RunConfig
from verl_grpo.data import load_split, prepare_dataset
from verl_grpo.store import Store, strip_scheme

MAX_PROMPT = 160  # below the tiny tokenizer's median GSM8K prompt, so the length check really quarantines rows
SUBSET = 48


@pytest.fixture(scope="module")
def prepared(tiny_model_dir, data_mirror, tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    store = Store(f"file://{tmp_path_factory.mktemp('store')}")
    cfg = RunConfig(dataset=DatasetConfig(name="gsm8k"), algorithm=AlgorithmConfig(max_prompt_length=MAX_PROMPT))
    return tokenizer, store, prepare_dataset(cfg, store, tokenizer=tokenizer)


def test_rlhf_dataset_loads_prepared_gsm8k(prepared, tmp_path):
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tokenizer import normalize_token_ids

    tokenizer, store, version = prepared
    assert version.rejected > 0  # the length check was applied with this tokenizer
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": MAX_PROMPT,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "verl-cache"),
        }
    )
    dataset = RLHFDataset(strip_scheme(version.splits["train"]), tokenizer, config, max_samples=SUBSET)
    # verl's own overlong filter keeps every row: our quarantine used the same token count.
    assert len(dataset) == SUBSET

    expected = load_split(version, "train", store).head(SUBSET)
    for i in (0, SUBSET - 1):
        item = dataset[i]
        assert item["data_source"] == "gsm8k" and item["ability"] == "math"
        assert item["reward_model"] == expected["reward_model"][i]
        assert item["reward_model"]["ground_truth"].lstrip("-").replace(".", "").isdigit()
        assert item["index"] == item["extra_info"]["index"] == i
        assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
        input_ids = normalize_token_ids(
            tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
        )
        assert 0 < len(input_ids) <= MAX_PROMPT
        assert tokenizer.decode(input_ids).rstrip().endswith("assistant")

    batch = next(iter(DataLoader(dataset, batch_size=8, collate_fn=collate_fn)))
    assert batch["dummy_tensor"].shape[0] == 8
    assert [r["ground_truth"] for r in batch["reward_model"]] == [
        r["ground_truth"] for r in expected["reward_model"][:8]
    ]


def test_rlhf_dataset_hands_tool_rows_to_verls_tool_loop(tiny_model_dir, data_mirror, tmp_path):
    """With retrieval on, verl's RLHFDataset yields `agent_name` (the loop AgentLoopManager runs per row) and the
    search tool's `tools_kwargs`, in a dataset version of its own."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_grpo.config.schema import ServicesConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    store = Store(f"file://{tmp_path / 'store'}")
    plain = prepare_dataset(RunConfig(dataset=DatasetConfig(name="gsm8k")), store)
    with_tools = RunConfig(dataset=DatasetConfig(name="gsm8k"), services=ServicesConfig(enabled=["retrieval"]))
    tools = prepare_dataset(with_tools, store)
    assert tools.hash != plain.hash
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": False,
                               "return_raw_chat": True, "cache_dir": str(tmp_path / "verl-cache")})
    item = RLHFDataset(strip_scheme(tools.splits["train"]), tokenizer, config, max_samples=4)[0]
    assert item["agent_name"] == "tool_agent"
    assert item["tools_kwargs"] == {"search": {"create_kwargs": {"data_source": "gsm8k"}}}
    assert "agent_name" not in RLHFDataset(strip_scheme(plain.splits["train"]), tokenizer, config, max_samples=4)[0]
