"""Loading: YAML files (paths or shipped profiles), env knobs and dotted overrides merged into one RunConfig.

Unknown keys and invalid values become one ConfigError naming the key (and the nearest valid one). The validated
config then gets the settings it implies (`defaults.resolve_defaults`), the one place a loaded value is filled in.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from verl_grpo.config.defaults import resolve_defaults
from verl_grpo.config.schema import DatasetName, RunConfig, accepts_empty
from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import configs_dir

# The env-var knobs of the public examples this pipeline grew out of (SkyPilot's llm/verl and verl-jobgroup tasks,
# the GRAIL verl/TRL scripts), each with the meaning it has there. MODEL/MODEL_NAME and LR/ACTOR_LR are two names
# of one knob; BATCH_SIZE is the per-device batch (it also sets trainer.micro_batch_size, TRL's); GRAD_ACCUM,
# USE_RETRIEVAL and DATASET's profile switch are handled by _derived_knobs / _dataset_profiles.
ENV_KNOBS: dict[str, str] = {
    "DATASET": "dataset.name",
    "MODEL_NAME": "model.name",
    "MODEL": "model.name",
    "TOTAL_STEPS": "algorithm.total_steps",
    "TOTAL_EPOCHS": "algorithm.total_epochs",
    "TRAIN_BATCH_SIZE": "algorithm.train_batch_size",
    "BATCH_SIZE": "verl.micro_batch_size_per_gpu",
    "WARMUP_STEPS": "algorithm.warmup_steps",
    "ROLLOUTS": "algorithm.rollouts",
    "CLIP_LOW": "algorithm.clip_low",
    "CLIP_HIGH": "algorithm.clip_high",
    "LR": "algorithm.lr",
    "ACTOR_LR": "algorithm.lr",
    "CRITIC_LR": "verl.critic_lr",
    "TEMPERATURE": "algorithm.temperature",
    "TOP_P": "algorithm.top_p",
    "TOP_K": "algorithm.top_k",
}
KNOB_ALSO_SETS: dict[str, tuple[str, ...]] = {"BATCH_SIZE": ("trainer.micro_batch_size",)}
"""Knobs that set more than their ENV_KNOBS key: the examples' per-device BATCH_SIZE is verl's micro batch per GPU and
the TRL backend's completions per forward/backward pass alike."""
ALIASES: tuple[tuple[str, str], ...] = (("MODEL", "MODEL_NAME"), ("ACTOR_LR", "LR"))
"""Two names of one knob: both may be set only to the same value."""
DERIVED_KNOBS: tuple[str, ...] = ("GRAD_ACCUM", "USE_RETRIEVAL")
"""Knobs that are no config key of their own: GRAD_ACCUM sets algorithm.train_batch_size = BATCH_SIZE × GRAD_ACCUM
(the public examples' effective batch), USE_RETRIEVAL adds or removes `retrieval` in services.enabled."""
ALL_KNOBS: tuple[str, ...] = (*ENV_KNOBS, *DERIVED_KNOBS)
KNOB_ORIGINS = {f"env var {var}" for var in KNOB_ALSO_SETS}

BY_DATASET = "by_dataset"
"""A config file's section of settings that apply only when the run trains on the dataset named (after the rest of
that file): configs/local.yaml sizes a QA run with the search tool, whose examples are several times longer, apart."""

DEFAULT_PROFILES: tuple[str, ...] = ("gsm8k",)
"""The shipped profiles of a run that names no config file (what the CLI without `-c` and the flow default to)."""


def config_files(configs: Sequence[str] | None) -> list[str]:
    """The config files or profiles to load: those given, or DEFAULT_PROFILES when none are.

    load_config itself takes an empty list as "field defaults only"; callers that mean "the default run" pass
    their files through this first.
    """
    return list(configs or ()) or list(DEFAULT_PROFILES)


def load_config(
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> RunConfig:
    """Merge files, env knobs and overrides into a validated RunConfig with its implied settings resolved
    (`resolve_defaults`: the services its placement and backend need), or raise ConfigError.

    An env knob that is set must hold a value (unset it for the default); so must every `-o key=value`, except
    for the fields that accept an empty string (`accepts_empty`). A value that does not parse as its field's type
    fails naming the env var or override it came from.
    """
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    paths = [resolve_config_path(f) for f in _dataset_profiles(files, env)]
    documents = [(path, _read_yaml(path)) for path in paths]
    dataset = _dataset_name([doc for _, doc in documents], env, overrides)
    for path, doc in documents:
        per_dataset = _by_dataset(path, doc.pop(BY_DATASET, None))
        _deep_merge(merged, doc)
        _deep_merge(merged, per_dataset.get(dataset) or {})
    knobs = _knob_values(env)
    for var, value in knobs.items():
        origin = f"env var {var}"
        for key in (ENV_KNOBS[var], *KNOB_ALSO_SETS.get(var, ())):
            _set_dotted(merged, key, value, origin)
            origins[key] = origin
    _derived_knobs(merged, origins, knobs, env)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value, e.g. -o algorithm.rollouts=8")
        origin = f"override {item!r}"
        _check_path(key.split("."), origin)
        _set_dotted(merged, key, _parse_value(key, raw, origin, "drop the override to use the default"), origin)
        origins[key] = origin
    _check_keys(merged, RunConfig, prefix="")
    try:
        cfg = RunConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origins)) from None
    if "CRITIC_LR" in knobs and cfg.verl.adv_estimator != "gae":
        raise ConfigError(f"env var CRITIC_LR: the critic's learning rate is only used by PPO with a critic "
                          f"(verl.adv_estimator=gae), and this run uses {cfg.verl.adv_estimator!r}; set "
                          "-o verl.adv_estimator=gae or unset CRITIC_LR")
    return resolve_defaults(cfg)


def _dataset_name(documents: Sequence[Mapping[str, Any]], env: Mapping[str, str], overrides: Sequence[str]) -> Any:
    """The run's dataset as the merge will resolve it: the last `-o dataset.name=`, else DATASET, else the last file
    naming one, else the field's default."""
    for item in reversed(overrides):
        key, sep, raw = item.partition("=")
        if sep and key.strip() == "dataset.name":
            return raw.strip()
    if "DATASET" in env:
        return env["DATASET"].strip()
    named = [d["dataset"]["name"] for d in documents
             if isinstance(d.get("dataset"), Mapping) and "name" in d["dataset"]]
    return named[-1] if named else RunConfig.model_fields["dataset"].default_factory().name


def _by_dataset(path: Path, section: Any) -> dict[str, Any]:
    """A file's `by_dataset:` section, checked: each key a dataset, each value sections of the config."""
    if section is None:
        return {}
    names = get_args(DatasetName)
    if not isinstance(section, Mapping):
        raise ConfigError(f"config file {path}: {BY_DATASET} must map dataset names ({', '.join(names)}) to settings")
    for name, settings in section.items():
        if name not in names:
            raise ConfigError(f"config file {path}: {BY_DATASET}.{name} names no dataset; use one of "
                              f"{', '.join(names)}")
        if not isinstance(settings, Mapping):
            raise ConfigError(f"config file {path}: {BY_DATASET}.{name} must hold sections (warm_start:, ...)")
        _check_keys(settings, RunConfig, prefix=f"{BY_DATASET}.{name}.")
    return dict(section)


def _knob_values(env: Mapping[str, str]) -> dict[str, Any]:
    """The parsed value of every set ENV_KNOBS knob; two names of one knob (ALIASES) must agree."""
    values = {var: _parse_value(key, env[var], f"env var {var}", f"unset {var} to use the default")
              for var, key in ENV_KNOBS.items() if var in env}
    for alias, name in ALIASES:
        if alias in values and name in values and not _same(values[alias], values[name]):
            raise ConfigError(f"env vars {alias}={env[alias]!r} and {name}={env[name]!r} both set "
                              f"{ENV_KNOBS[name]} and disagree; they are one knob: unset {alias} or give both the "
                              "same value")
    return values


def _same(a: Any, b: Any) -> bool:
    """Equal values, `1e-6` and `0.000001` included (YAML reads an exponent without a dot as text)."""
    try:
        return a == b or float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _dataset_profiles(files: Sequence[str | Path], env: Mapping[str, str]) -> list[str | Path]:
    """The files to read: with DATASET set, a shipped dataset profile among them (gsm8k, math, mbpp) is replaced by
    DATASET's, as DATASET in the public SkyPilot + verl examples picks the dataset together with its lengths and batch
    sizes."""
    if "DATASET" not in env:
        return list(files)
    name = _parse_value("dataset.name", env["DATASET"], "env var DATASET", "unset DATASET to use the default")
    names = get_args(DatasetName)
    if name not in names:
        raise ConfigError(f"dataset.name (env var DATASET): unknown dataset {name!r}; use one of {', '.join(names)}")
    profiles = {(configs_dir() / f"{n}.yaml").resolve() for n in names}
    return [configs_dir() / f"{name}.yaml" if resolve_config_path(f).resolve() in profiles else f for f in files]


def _derived_knobs(merged: dict[str, Any], origins: dict[str, str], knobs: Mapping[str, Any],
                   env: Mapping[str, str]) -> None:
    if "GRAD_ACCUM" in env:
        accum = _positive_int("GRAD_ACCUM", env["GRAD_ACCUM"], "gradient-accumulation steps per optimizer step")
        if "BATCH_SIZE" not in knobs:
            raise ConfigError("env var GRAD_ACCUM: the train batch is BATCH_SIZE × GRAD_ACCUM prompts; set "
                              "BATCH_SIZE (the per-device batch) too, or set TRAIN_BATCH_SIZE instead")
        batch = knobs["BATCH_SIZE"]
        if not isinstance(batch, int) or isinstance(batch, bool):
            return  # the field's own validation names BATCH_SIZE
        product = batch * accum
        if "TRAIN_BATCH_SIZE" in knobs and knobs["TRAIN_BATCH_SIZE"] != product:
            raise ConfigError(f"env vars BATCH_SIZE={env['BATCH_SIZE']!r} × GRAD_ACCUM={env['GRAD_ACCUM']!r} = "
                              f"{product} and TRAIN_BATCH_SIZE={env['TRAIN_BATCH_SIZE']!r} both set "
                              "algorithm.train_batch_size and disagree; unset TRAIN_BATCH_SIZE or GRAD_ACCUM")
        origin = "env vars BATCH_SIZE × GRAD_ACCUM"
        _set_dotted(merged, "algorithm.train_batch_size", product, origin)
        origins["algorithm.train_batch_size"] = origin
    if "USE_RETRIEVAL" in env:
        use = _boolean("USE_RETRIEVAL", env["USE_RETRIEVAL"], "run the retrieval-server and verl's search tool")
        services = merged.get("services")
        section = {"enabled": services} if isinstance(services, list) else dict(services or {})
        enabled = [s for s in section.get("enabled") or [] if s != "retrieval"]
        section["enabled"] = [*enabled, "retrieval"] if use else enabled
        merged["services"] = section
        origins["services.enabled"] = "env var USE_RETRIEVAL"


def _positive_int(var: str, raw: str, meaning: str) -> int:
    value = _env_value(var, raw, f"give the {meaning} or unset {var}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"env var {var}: {raw!r} is not a whole number >= 1; give the {meaning} or unset {var}")
    return value


def _boolean(var: str, raw: str, meaning: str) -> bool:
    fix = f"set {var}=true ({meaning}) or false, or unset {var}"
    value = _env_value(var, raw, fix)
    if value in (0, 1) and not isinstance(value, float):
        value = bool(value)
    if not isinstance(value, bool):
        raise ConfigError(f"env var {var}: {raw!r} is not true/false; {fix}")
    return value


def _env_value(var: str, raw: str, fix: str) -> object:
    """The env var's value read as YAML (None when it is no YAML); one line naming the var when it is empty."""
    if not raw.strip():
        raise ConfigError(f"env var {var}: empty value; {fix}")
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return None


def resolve_config_path(f: str | Path) -> Path:
    """A config path as given, or a shipped profile name (`gsm8k` → configs/gsm8k.yaml)."""
    p = Path(f)
    if p.is_file():
        return p
    shipped = configs_dir() / (p.name if p.suffix else f"{p.name}.yaml")
    if shipped.is_file():
        return shipped
    raise ConfigError(f"config file {str(f)!r} not found; pass a path or one of: {', '.join(shipped_profiles())}")


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (dataset:, model:, ...)")
    return data


def _parse_value(key: str, raw: str, origin: str, default_hint: str) -> Any:
    """The value of an env knob or override: YAML for numbers, booleans, lists and `null`; the text as given for a
    text field. Empty or whitespace-only is an error naming the knob, except for a field that accepts empty."""
    field = _field(key.split("."))
    if not raw.strip():
        if accepts_empty(field):
            return raw
        null = "; `null` sets it to None" if _optional(field) else ""
        raise ConfigError(f"{origin}: empty value for {key}; give a value or {default_hint}{null}")
    if _is_text(field) and raw.strip() not in ("null", "~"):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _field(parts: list[str]) -> FieldInfo | None:
    model: type[BaseModel] | None = RunConfig
    info = None
    for part in parts:
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _section_type(model, part)
    return info


def _optional(field: FieldInfo | None) -> bool:
    return field is not None and type(None) in get_args(field.annotation)


def _is_text(field: FieldInfo | None) -> bool:
    """A plain text field (`str`, `str | None`): `MODEL_NAME=123` or `-o model.name=on` stays the text given."""
    return field is not None and (field.annotation is str or set(get_args(field.annotation)) == {str, type(None)})


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = dict(v) if isinstance(v, Mapping) else v


def _set_dotted(tree: dict[str, Any], key: str, value: Any, origin: str) -> None:
    parts = key.split(".")
    _check_path(parts, origin)
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{origin}: {part!r} is not a section")
    node[parts[-1]] = value


def _check_path(parts: list[str], origin: str) -> None:
    model: type[BaseModel] | None = RunConfig
    for i, part in enumerate(parts):
        if model is None:
            raise ConfigError(f"{origin}: {'.'.join(parts[:i])!r} is a value, not a section")
        if part not in model.model_fields:
            raise ConfigError(_unknown_key_message(".".join(parts[:i]), part, model, origin))
        model = _section_type(model, part)


def _check_keys(tree: Mapping[str, Any], model: type[BaseModel], prefix: str) -> None:
    for key, value in tree.items():
        if key not in model.model_fields:
            raise ConfigError(_unknown_key_message(prefix, key, model, "config"))
        sub = _section_type(model, key)
        if sub is not None and isinstance(value, Mapping):
            _check_keys(value, sub, f"{prefix}{key}.")


def _section_type(model: type[BaseModel], field: str) -> type[BaseModel] | None:
    ann = model.model_fields[field].annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _unknown_key_message(prefix: str, key: str, model: type[BaseModel], origin: str) -> str:
    where = prefix.rstrip(".")
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.5)
    suggestion = (f"{where}.{close[0]}" if where else close[0]) if close else None
    hint = f"did you mean {suggestion!r}? " if suggestion else ""
    valid = ", ".join(model.model_fields)
    return f"{origin}: unknown key {full!r}; {hint}valid keys here: {valid}"


def _format_validation_error(e: ValidationError, origins: Mapping[str, str]) -> str:
    """One line per invalid value, naming the key and the env var or override it came from."""
    lines = []
    knobs_named: set[str] = set()
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        source = next((origins[k] for k in sorted(origins, key=len, reverse=True)
                       if loc == k or loc.startswith(f"{k}.")), None)
        if source in KNOB_ORIGINS:  # a knob that sets two keys (BATCH_SIZE) is named once
            if source in knobs_named:
                continue
            knobs_named.add(source)
        where = f"{loc} ({source})" if source else loc
        # a whole-config check names its own fields; echoing its input would print the entire config
        lines.append(f"{where}: {msg} (got {err.get('input')!r})" if loc else f"config: {msg}")
    return "invalid config: " + lines[0] if len(lines) == 1 else "invalid config:\n  " + "\n  ".join(lines)
