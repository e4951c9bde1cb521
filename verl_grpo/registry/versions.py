"""The model files in MLflow: logged once per run as an MLflow LoggedModel (transformers flavor), registered once.

The logged model is an MLflow transformers model whose `model/` subdirectory is the plain Hugging Face
checkpoint, so `AutoModelForCausalLM.from_pretrained` loads it directly. It is the run's output (the runs
table's Models column) and each registered version points at it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from mlflow.entities import LoggedModel, LoggedModelOutput, LoggedModelStatus
from mlflow.entities.model_registry import ModelVersion as MlflowModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

MODEL_NAME = "model"
"""Name of the logged model of each run."""
HF_SUBDIR = "model"
"""Where mlflow.transformers puts the checkpoint files inside the logged model."""
MODEL_URI_TAG = "verl_grpo.model_uri"


def log_hf_model(client: MlflowClient, experiment_id: str, mlflow_run_id: str, model_dir: Path, title: str,
                 step: int) -> LoggedModel:
    """The run's model as a LoggedModel output of the run at `step`: uploaded once (a retry finds the READY one)."""
    logged = client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{mlflow_run_id}'")
    ready = [m for m in logged if m.status == LoggedModelStatus.READY]
    model = ready[0] if ready else _upload_hf_model(client, experiment_id, mlflow_run_id, model_dir, title)
    outputs = client.get_run(mlflow_run_id).outputs
    if model.model_id not in {o.model_id for o in (outputs.model_outputs if outputs else [])}:
        client.log_outputs(mlflow_run_id, [LoggedModelOutput(model.model_id, step)])
    return model


def _upload_hf_model(client: MlflowClient, experiment_id: str, mlflow_run_id: str, model_dir: Path,
                     title: str) -> LoggedModel:
    import mlflow.transformers
    from huggingface_hub import ModelCard
    from mlflow.models import Model

    model = client.create_logged_model(experiment_id, name=MODEL_NAME, source_run_id=mlflow_run_id)
    # A card of our own keeps mlflow from looking the local path up on the Hugging Face hub.
    card = ModelCard(f"---\nlicense: other\nlibrary_name: transformers\n---\n# {title}\n\n"
                     "GRPO post-trained by verl-grpo. Load `model/` with AutoModelForCausalLM.from_pretrained.\n")
    with tempfile.TemporaryDirectory(prefix="verl-grpo-mlflow-") as tmp, _no_license_warning():
        local = Path(tmp) / MODEL_NAME
        mlflow.transformers.save_model(transformers_model=str(model_dir), path=str(local), task="text-generation",
                                       model_card=card, pip_requirements=serving_requirements(),
                                       mlflow_model=Model(artifact_path=model.artifact_location, run_id=mlflow_run_id,
                                                          model_uuid=model.model_id, model_id=model.model_id))
        client.log_model_artifacts(model.model_id, str(local))
    return client.finalize_logged_model(model.model_id, "READY")


@contextlib.contextmanager
def _no_license_warning() -> Iterator[None]:
    """Drop mlflow.transformers' "Unable to find license information" warning: a trained model's license is its
    base model's, which the card cannot know (hence `license: other`), and the user cannot act on the warning."""
    logger = logging.getLogger("mlflow.transformers")

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Unable to find license information")

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def serving_requirements() -> list[str]:
    """Pins of what loading the model needs. MLflow's defaults for transformers add torchvision, which
    this project does not install (and inferring them would load the model)."""
    from importlib.metadata import version

    return [f"{pkg}=={version(pkg).split('+')[0]}" for pkg in ("torch", "transformers", "tokenizers", "safetensors")]


def ensure_registered_model(client: MlflowClient, name: str, description: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(name, description=description)
        except MlflowException as exists:  # a concurrent registration created it first
            if exists.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def find_or_create_version(
    client: MlflowClient, name: str, mlflow_run_id: str, model: LoggedModel, model_uri: str, tags: Mapping[str, str]
) -> tuple[MlflowModelVersion, bool]:
    """(version, created): the version of this run's model when one exists, else a new one of the logged `model`
    with `tags`, listed on the logged model's page."""
    found = [v for v in client.search_model_versions(f"name='{_quote(name)}' and run_id='{mlflow_run_id}'")
             if v.tags.get(MODEL_URI_TAG) == model_uri]
    version = found[0] if found else client.create_model_version(
        name, source=model.artifact_location, run_id=mlflow_run_id, tags={**tags, MODEL_URI_TAG: model_uri},
        model_id=model.model_id)
    listed = json.loads(client.get_logged_model(model.model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    if not any(entry["name"] == name and str(entry["version"]) == str(version.version) for entry in listed):
        client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
            [*listed, {"name": name, "version": version.version}])})
    return version, not found


def version_by_alias(client: MlflowClient, name: str, alias: str) -> MlflowModelVersion | None:
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def download_version(tracking_uri: str, name: str, version_or_alias: str, dst: Path) -> Path:
    """Download a registered version (number or alias) into `dst`; returns the Hugging Face checkpoint directory."""
    import mlflow.artifacts

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    if version_or_alias.isdigit():
        version = client.get_model_version(name, version_or_alias)
    else:
        version = client.get_model_version_by_alias(name, version_or_alias)
    # models:/ URIs would resolve against the process-global registry; the version's source is explicit.
    uri = client.get_model_version_download_uri(name, version.version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst), tracking_uri=tracking_uri))
    return local / HF_SUBDIR if (local / HF_SUBDIR / "config.json").is_file() else local


def _quote(value: str) -> str:
    return value.replace("'", "\\'")
