"""The env knobs of the public SkyPilot + verl examples in a rendered verl task: SkyPilot `envs` whose defaults are this
run's values, and a run script that builds the knob-driven main_ppo overrides from them, so that
`sky jobs launch task.yaml --env MODEL_NAME=... --env TOTAL_STEPS=...` changes the run as it does in those examples.

Pure: no `sky` import. The loader (`verl_grpo.config.loader`) gives the same knobs the same meaning on this machine.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verl_grpo.config import ENV_KNOBS, RunConfig
from verl_grpo.trainers.verl.overrides import mini_batch_count, tool_overrides

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"

KNOB_OF_OVERRIDE: dict[str, str] = {
    "actor_rollout_ref.model.path": "MODEL_NAME",
    "critic.model.path": "MODEL_NAME",
    "data.train_batch_size": "TRAIN_BATCH_SIZE",
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": "BATCH_SIZE",
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": "BATCH_SIZE",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "BATCH_SIZE",
    "critic.ppo_micro_batch_size_per_gpu": "BATCH_SIZE",
    f"{ACTOR}.optim.lr": "LR",
    f"{ACTOR}.optim.lr_warmup_steps": "WARMUP_STEPS",
    "critic.optim.lr": "CRITIC_LR",
    f"{ACTOR}.clip_ratio_low": "CLIP_LOW",
    f"{ACTOR}.clip_ratio_high": "CLIP_HIGH",
    f"{ROLLOUT}.n": "ROLLOUTS",
    f"{ROLLOUT}.temperature": "TEMPERATURE",
    f"{ROLLOUT}.top_p": "TOP_P",
    f"{ROLLOUT}.top_k": "TOP_K",
    "trainer.total_training_steps": "TOTAL_STEPS",
    "trainer.total_epochs": "TOTAL_EPOCHS",
}
"""main_ppo override key → the env knob whose value it takes in the rendered run script."""
OPTIONAL_KNOBS = ("TOTAL_EPOCHS",)
"""Knobs rendered only when the run sets them (SkyPilot envs hold no None); `--env` adds them."""


@dataclass(frozen=True)
class KnobTask:
    """What the verl run script needs for the env knobs."""

    envs: dict[str, str]
    """Knob → this run's value: the task's `envs` defaults."""
    prelude: list[str]
    """Shell lines resolving aliases (MODEL, ACTOR_LR), GRAD_ACCUM, DATASET and USE_RETRIEVAL, before main_ppo."""
    train_command: str
    """main_ppo with every knob-driven override taken from its env var."""
    train_batch: str
    """The shell expression of the train batch (for the finalize entry)."""


def knob_task(cfg: RunConfig, command: Sequence[str], retrieval_available: bool,
              derived: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None,
              literal: Sequence[str] = (), whole_mini_batches: bool = False) -> KnobTask:
    """`command` (python -m verl.trainer.main_ppo OVERRIDES...) with each knob-driven override reading its env var,
    in place; TOTAL_EPOCHS (when given) and the retrieval overrides go just before the user's extra_overrides.

    `derived` maps override keys to shell arithmetic over the knobs (`TOTAL_STEPS * TRAIN_BATCH_SIZE`), rendered as
    `key="$((…))"`; `defaults` seeds knob defaults that no override carries as a plain value; `literal` keys are
    rendered as they are (verl's fully-async trainer: data.train_batch_size=0, see `fully_async.knob_expressions`).
    With `whole_mini_batches` (verl's fully-async trainer, whose step is require_batches whole mini-batches) a
    TRAIN_BATCH_SIZE that is not a whole number of them fails the run in one line instead of training other steps."""
    derived = derived or {}
    envs: dict[str, str] = {"DATASET": cfg.dataset.name, **(defaults or {})}
    extras = len(cfg.verl.extra_overrides)
    head, tail = list(command[:len(command) - extras]), list(command[len(command) - extras:])
    retrieval = tool_overrides(cfg)  # what USE_RETRIEVAL switches on: verl's tool loop with the search tool
    retrieval_keys = {o.partition("=")[0] for o in retrieval}
    args: list[str] = []
    for arg in head:
        key, sep, value = arg.partition("=")
        if sep and key in retrieval_keys:
            continue  # $RETRIEVAL_OVERRIDES below
        if sep and key in derived:
            args.append(f'{key}="$(({derived[key]}))"')
            continue
        if sep and key in literal:
            args.append(shlex.quote(arg))
            continue
        if key == f"{ACTOR}.ppo_mini_batch_size" and cfg.verl.ppo_mini_batch_size is None:
            # the mini batch follows the train batch: TRAIN_BATCH_SIZE over the config's mini-batch count
            # (at least 1: a TRAIN_BATCH_SIZE below the count at launch still trains, in mini-batches of one)
            count = _mini_batches(cfg)
            mini = f"TRAIN_BATCH_SIZE >= {count} ? TRAIN_BATCH_SIZE / {count} : 1"
            args.append(f'{key}="$TRAIN_BATCH_SIZE"' if count == 1 else f'{key}="$(({mini}))"')
            continue
        var = KNOB_OF_OVERRIDE.get(key) if sep else None
        if var is None or envs.setdefault(var, value) != value:
            args.append(shlex.quote(arg))
        elif var not in OPTIONAL_KNOBS:
            args.append(f'{key}="${var}"')
    envs["USE_RETRIEVAL"] = "true" if "retrieval" in cfg.services.enabled else "false"
    optional = [f"${{{var}:+{key}=${var}}}" for key, var in KNOB_OF_OVERRIDE.items() if var in OPTIONAL_KNOBS]
    order = [*ENV_KNOBS, "USE_RETRIEVAL"]
    return KnobTask(
        envs={k: envs[k] for k in sorted(envs, key=order.index)},
        prelude=_prelude(envs, retrieval if retrieval_available else None)
        + (_whole_mini_batches(cfg) if whole_mini_batches else []),
        train_command=" ".join([*args, *optional, "$RETRIEVAL_OVERRIDES", *map(shlex.quote, tail)]),
        train_batch='"$TRAIN_BATCH_SIZE"',
    )


def _mini_batches(cfg: RunConfig) -> int:
    """The config's mini-batches a step: what TRAIN_BATCH_SIZE is split into while verl.ppo_mini_batch_size is unset."""
    return mini_batch_count(cfg.algorithm.train_batch_size, cfg.verl.ppo_mini_batches)


def _whole_mini_batches(cfg: RunConfig) -> list[str]:
    mini = cfg.verl.ppo_mini_batch_size
    multiple = mini or _mini_batches(cfg)
    if multiple == 1:
        return []
    what = f"verl.ppo_mini_batch_size={mini}" if mini else f"{multiple} mini-batches a step"
    return [f'[ "$((TRAIN_BATCH_SIZE % {multiple}))" = 0 ] || {{ echo "env var TRAIN_BATCH_SIZE=$TRAIN_BATCH_SIZE is '
            f"not a multiple of {multiple}: verl's fully-async trainer takes whole mini-batches ({what}), so each "
            f'step would train on another number of prompts; use a multiple of {multiple}" >&2; exit 1; }}']


def _prelude(envs: dict[str, str], retrieval: list[str] | None) -> list[str]:
    """`retrieval`: the overrides USE_RETRIEVAL=true adds; None when the task runs no retrieval-server."""
    dataset, model, lr, batch = (shlex.quote(envs[k]) for k in ("DATASET", "MODEL_NAME", "LR", "TRAIN_BATCH_SIZE"))
    no_retrieval = ("echo \"USE_RETRIEVAL=$USE_RETRIEVAL: this task runs no retrieval-server; render one with "
                    "services.enabled including retrieval (skypilot.shape=job_group)\" >&2; exit 1")
    return [
        "# Env knobs as in the public SkyPilot + verl examples (envs above, defaults = this run): `sky jobs launch "
        "THIS.yaml --env TOTAL_STEPS=50`.",
        "knob() {  # knob NAME ALIAS DEFAULT: NAME's value, or ALIAS's when only ALIAS differs from DEFAULT",
        '  local a="${!1}" b="${!2:-$3}"',
        '  if [ "$b" = "$3" ] || [ "$a" = "$b" ]; then echo "$a"; elif [ "$a" = "$3" ]; then echo "$b"; else',
        '    echo "env vars $1=$a and $2=$b disagree; they are one knob: unset $2 or give both the same value" >&2',
        "    return 1; fi",
        "}",
        f'[ "$DATASET" = {dataset} ] || {{ echo "DATASET=$DATASET: this task trains the prepared {envs["DATASET"]} '
        f'data it mounts; render a task for $DATASET with: verl-grpo launch -c $DATASET --provider skypilot" >&2; '
        "exit 1; }",
        f"MODEL_NAME=$(knob MODEL_NAME MODEL {model})",
        f"LR=$(knob LR ACTOR_LR {lr})",
        'if [ -n "${GRAD_ACCUM:-}" ]; then',
        f'  if [ "$TRAIN_BATCH_SIZE" != {batch} ] && [ "$TRAIN_BATCH_SIZE" != "$((BATCH_SIZE * GRAD_ACCUM))" ]; then',
        '    echo "env vars BATCH_SIZE × GRAD_ACCUM ($((BATCH_SIZE * GRAD_ACCUM))) and '
        'TRAIN_BATCH_SIZE=$TRAIN_BATCH_SIZE '
        'disagree; unset TRAIN_BATCH_SIZE or GRAD_ACCUM" >&2; exit 1',
        "  fi",
        "  TRAIN_BATCH_SIZE=$((BATCH_SIZE * GRAD_ACCUM))",
        "fi",
        'case "$USE_RETRIEVAL" in',
        f"  true|True|1) {'RETRIEVAL_OVERRIDES=' + shlex.quote(' '.join(retrieval)) if retrieval else no_retrieval} ;;",
        '  false|False|0) RETRIEVAL_OVERRIDES="" ;;',
        '  *) echo "USE_RETRIEVAL=$USE_RETRIEVAL is not true/false" >&2; exit 1 ;;',
        "esac",
    ]

