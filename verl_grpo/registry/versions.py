"""The model files in MLflow: logged once per run with the transformers flavor, registered once per model.

The logged artifact `model/` is an MLflow transformers model whose `model/model/` subdirectory is the
plain Hugging Face checkpoint, so `AutoModelForCausalLM.from_pretrained` loads it directly.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from mlflow.entities.model_registry import ModelVersion as MlflowModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

MODEL_ARTIFACT = "model"
HF_SUBDIR = "model"
"""Where mlflow.transformers puts the checkpoint files inside the logged model."""
MODEL_LOGGED_TAG = "verl_grpo.model_logged"
MODEL_URI_TAG = "verl_grpo.model_uri"


def log_hf_model(client: MlflowClient, mlflow_run_id: str, model_dir: Path, title: str) -> str:
    """Log `model_dir` as the run's `model` artifact once (tagged after the upload completes); return its URI."""
    run = client.get_run(mlflow_run_id)
    if run.data.tags.get(MODEL_LOGGED_TAG) != "true":
        import mlflow.transformers
        from huggingface_hub import ModelCard

        # A card of our own keeps mlflow from looking the local path up on the Hugging Face hub.
        card = ModelCard(f"---\nlicense: other\nlibrary_name: transformers\n---\n# {title}\n\n"
                         "GRPO post-trained by verl-grpo. Load `model/` with AutoModelForCausalLM.from_pretrained.\n")
        with tempfile.TemporaryDirectory(prefix="verl-grpo-mlflow-") as tmp:
            local = Path(tmp) / MODEL_ARTIFACT
            mlflow.transformers.save_model(transformers_model=str(model_dir), path=str(local),
                                           task="text-generation", model_card=card,
                                           pip_requirements=serving_requirements())
            client.log_artifacts(mlflow_run_id, str(local), MODEL_ARTIFACT)
        client.set_tag(mlflow_run_id, MODEL_LOGGED_TAG, "true")
    return f"{run.info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}"


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
    client: MlflowClient, name: str, mlflow_run_id: str, source: str, model_uri: str, tags: Mapping[str, str]
) -> tuple[MlflowModelVersion, bool]:
    """(version, created): the version of this run's model when one exists, else a new one with `tags`."""
    for version in client.search_model_versions(f"name='{_quote(name)}' and run_id='{mlflow_run_id}'"):
        if version.tags.get(MODEL_URI_TAG) == model_uri:
            return version, False
    created = client.create_model_version(name, source=source, run_id=mlflow_run_id,
                                          tags={**tags, MODEL_URI_TAG: model_uri})
    return created, True


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
