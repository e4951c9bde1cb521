"""Data preparation: raw GSM8K / MATH / MBPP / SQuAD, the user's own files or reasoning-gym's generators →
verl-format, content-hashed parquet in the store.

`prepare_dataset(cfg, store, tokenizer=None) -> DatasetVersion` is what the pipeline calls;
`load_split(dataset, split, store) -> DataFrame` reads a prepared split back (eval, trainers).
"""

from verl_grpo.data.prepare import BUILDERS, builder_for, load_split, prepare_dataset
from verl_grpo.data.schema import Reason

__all__ = ["BUILDERS", "Reason", "builder_for", "load_split", "prepare_dataset"]
