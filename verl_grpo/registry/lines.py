"""Which versions of a registered model compete for `champion`: those of one line, a base model on a dataset.

Every version carries its line as the `comparability` tag (`dataset=gsm8k base=HuggingFaceTB/SmolLM2-135M-Instruct`).
The promotion gate compares a new version with the champion only when both carry the same key; otherwise the
new version is registered without an alias (neither `challenger` nor `champion`), and its decision says why and how to
give its base model a registered model of its own. So a run on the `tiny` test model, or any other base model,
can neither displace the SmolLM2 champion nor be displaced by it.

What must match, and what may differ:
- hard (the key): the base model, by canonical id (the spellings of SmolLM2 are one model, and so are `tiny` and
  the directory it is built in; an HF id; another local directory as given) and the dataset name. Different starting
  points or tasks are different products, and no re-evaluation turns one into the other.
- reconciled by re-evaluation: the eval settings (split, subset = limit + seed, generation budget, samples,
  temperature, top_p) and the dataset version. All of them are in the eval settings key (evaluate.runner.plan_eval
  hashes the dataset hash, split, subset and generation parameters); when it differs from the champion's, the
  champion is re-evaluated with tonight's settings (register.champion_needs_reeval), so both models answer the same
  problems with the same prompts before the paired test. The dataset hash is not a hard key because it also hashes
  the tokenizer's local path and training-only settings (max_prompt_length, val_size): as a hard key it would
  freeze a line after any preparation change and split one line across machines. It stays a version tag (lineage).

The registered model's name stays `tracking.registered_model` or `verl-grpo-{dataset}` (what users, deployments and
the champion's re-evaluation read); lines are kept apart inside it, and a base model of its own line is given its
own name with `tracking.registered_model`. A registered model's line is its champion's: the first version crowned
sets it, and moving the `champion` alias by hand (MLflow UI) to a version of another line switches it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities.model_registry import ModelVersion as MlflowModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verl_grpo.config import RunConfig
from verl_grpo.models import MARKER, MODEL_ALIASES, SMOLLM2_HF_ID, model_short_name

COMPARABILITY_TAG = "comparability"
BASE_MODEL_TAG, DATASET_NAME_TAG = "model.base", "dataset.name"
"""Tags of the run (and, for the base model, the version) that older versions' lines are read from."""


@dataclass(frozen=True)
class Line:
    base_model: str
    """Canonical id of the base model (see canonical_model)."""
    dataset: str

    @classmethod
    def of(cls, base_model: str, dataset: str) -> "Line":
        return cls(canonical_model(base_model), dataset)

    @property
    def key(self) -> str:
        """The `comparability` tag: readable in MLflow's versions table, searchable as a version tag."""
        return f"dataset={self.dataset} base={self.base_model}"

    @property
    def label(self) -> str:
        return f"{model_short_name(self.base_model)} on {self.dataset}"

    def own_model_name(self) -> str:
        """A registered model name for this line alone, as `tracking.registered_model` takes it."""
        return f"verl-grpo-{self.dataset}-{model_short_name(self.base_model)}"


def run_line(cfg: RunConfig) -> Line:
    """The line a run of `cfg` belongs to."""
    return Line.of(cfg.model.name, cfg.task)


def canonical_model(name: str) -> str:
    """One id per base model: SmolLM2's spellings → its HF id; a directory this package built (the model cache's
    `tiny`, converted SmolLM2; its marker says which) → that model's id; others as given (trailing `/` dropped)."""
    name = name.strip().rstrip("/")
    return MODEL_ALIASES.get(name.lower()) or _built_model(name) or name


def _built_model(name: str) -> str | None:
    try:
        identity = json.loads((Path(name).expanduser() / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if identity.get("kind") == "tiny" and identity.get("seed") == 0:  # what model.name=tiny builds
        return "tiny"
    return SMOLLM2_HF_ID if identity.get("kind") == "smollm2" else None


def version_line(client: MlflowClient, version: MlflowModelVersion) -> Line | None:
    """The line a registered version belongs to: from its `comparability` tag, or for a version registered before
    the tag existed, from its `model.base` tag and its run's dataset name; None when neither says."""
    key = version.tags.get(COMPARABILITY_TAG)
    if key:
        return parse_key(key)
    base = version.tags.get(BASE_MODEL_TAG)
    dataset = _run_tags(client, version.run_id).get(DATASET_NAME_TAG)
    return Line.of(base, dataset) if base and dataset else None


def parse_key(key: str) -> Line | None:
    """The Line of a `comparability` tag value; None for a value this code did not write."""
    head, sep, base = key.partition(" base=")
    if not sep or not head.startswith("dataset="):
        return None
    return Line(base, head.removeprefix("dataset="))


def other_line_reason(champion_label: str, champion: Line | None, challenger_label: str, challenger: Line) -> str:
    """The one-line decision of a version that does not compete with a champion of another line (base models by
    their full ids where the short names coincide: `tiny` and a local copy of it, say)."""
    full = champion is not None and champion.label == challenger.label
    name = (lambda line: f"{line.base_model} on {line.dataset}") if full else (lambda line: line.label)
    was = f"trained from {name(champion)}" if champion else "of an unknown base model (its version has no line tags)"
    return (f"not promoted: champion {champion_label} was {was}, {challenger_label} from {name(challenger)}; "
            f"register under tracking.registered_model={challenger.own_model_name()} to keep lines apart")


def _run_tags(client: MlflowClient, mlflow_run_id: str | None) -> Mapping[str, str]:
    if not mlflow_run_id:
        return {}
    try:
        return client.get_run(mlflow_run_id).data.tags
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return {}
        raise
