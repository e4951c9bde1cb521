"""Loading: YAML files (paths or shipped profiles), env knobs and dotted overrides merged into one RunConfig.

Unknown keys and invalid values become one ConfigError naming the key (and the nearest valid one).
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

from verl_grpo.config.schema import RunConfig, accepts_empty
from verl_grpo.errors import ConfigError
from verl_grpo.paths import configs_dir

# The env-var knobs of the public examples this pipeline grew out of.
ENV_KNOBS: dict[str, str] = {
    "MODEL_NAME": "model.name",
    "TOTAL_STEPS": "algorithm.total_steps",
    "TRAIN_BATCH_SIZE": "algorithm.train_batch_size",
    "ROLLOUTS": "algorithm.rollouts",
    "CLIP_LOW": "algorithm.clip_low",
    "CLIP_HIGH": "algorithm.clip_high",
    "LR": "algorithm.lr",
    "TEMPERATURE": "algorithm.temperature",
    "TOP_P": "algorithm.top_p",
    "TOP_K": "algorithm.top_k",
}

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
    """Merge files, env knobs and overrides into a validated RunConfig, or raise ConfigError.

    An env knob that is set must hold a value (unset it for the default); so must every `-o key=value`, except
    for the fields that accept an empty string (`accepts_empty`). A value that does not parse as its field's type
    fails naming the env var or override it came from.
    """
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for f in files:
        _deep_merge(merged, _read_yaml(resolve_config_path(f)))
    for var, key in ENV_KNOBS.items():
        if var in env:
            origin = f"env var {var}"
            _set_dotted(merged, key, _parse_value(key, env[var], origin, f"unset {var} to use the default"), origin)
            origins[key] = origin
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
        return RunConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origins)) from None


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
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        source = next((origins[k] for k in sorted(origins, key=len, reverse=True)
                       if loc == k or loc.startswith(f"{k}.")), None)
        where = f"{loc} ({source})" if source else loc
        # a whole-config check names its own fields; echoing its input would print the entire config
        lines.append(f"{where}: {msg} (got {err.get('input')!r})" if loc else f"config: {msg}")
    return "invalid config: " + lines[0] if len(lines) == 1 else "invalid config:\n  " + "\n  ".join(lines)
