"""verl-grpo: the domain logic of the GRPO post-training pipeline (no Prefect import here)."""

__version__ = "0.1.0"
