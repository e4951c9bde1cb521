"""Token counts of the GSM8K train prompts as the pipeline builds them, for `bench/gpu_attention.py`.

`python bench/gsm8k_prompt_lengths.py OUT.json`: reads the shared mirror (../shared/data/gsm8k or
VERL_GRPO_DATA_MIRROR), applies the default system prompt and chat template with SmolLM2's tokenizer (the
pipeline's own `prompt_token_counts`), and writes the list of lengths: numbers only, no dataset text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from verl_grpo.data import gsm8k
from verl_grpo.data.prepare import chat_messages, prompt_token_counts
from verl_grpo.formats import default_system_prompt
from verl_grpo.local_paths import data_mirror_dir, model_cache_dir
from verl_grpo.models import ensure_smollm2


def main(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2(model_cache_dir()))
    records = [r for r in gsm8k.read_mirror(data_mirror_dir() / "gsm8k") if r.split == "train"]
    system = default_system_prompt("gsm8k")
    conversations = [chat_messages(system, "{question}", gsm8k.to_problem(r).question) for r in records]
    out.write_text(json.dumps(prompt_token_counts(tokenizer, conversations)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
