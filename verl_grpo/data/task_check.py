"""The run's data and reward checked before anything starts: one line naming the setting when something is wrong."""

from __future__ import annotations

from verl_grpo.config import RunConfig
from verl_grpo.data.prepare import builder_for
from verl_grpo.data.sources import check_mirror, mirror_knob, missing_mirror_message, resolve_mirror_dir
from verl_grpo.errors import VerlGrpoError
from verl_grpo.rewards.user_reward import UserReward


def check_task(cfg: RunConfig) -> str:
    """The run's data and reward, checked before anything starts (one line naming the setting otherwise): the data
    mirror holds the dataset, the user's files read (every row parsed, the keys found), the reasoning-gym generators
    exist, the user's reward function imports. Returns what was checked."""
    builder = builder_for(cfg.dataset)
    if builder.load is not None:
        source = builder.load(cfg.dataset, cfg.storage.endpoint_url)
        checked = f"{source.description} ({len(source.read_records())} rows read)" if cfg.dataset.name == "custom" \
            else source.description
    elif cfg.dataset.source != "hub":
        missing = check_mirror(cfg.dataset, builder)
        checked = f"{cfg.dataset.name} mirror" + (f" (lacks {', '.join(missing)}: the hub is tried)" if missing else "")
    else:
        checked = f"{cfg.dataset.name} from the hub"
    user = UserReward.of(cfg)
    if user is not None:
        user.check()
        checked += f"; reward {user.label} imports"
    return checked


def data_check(cfg: RunConfig) -> tuple[bool, str]:
    """Whether the run's data can be had, and what was found (`verl-grpo validate`'s and the dry run's data check):
    the task's own files, generators and reward checked in full, a shipped dataset's mirror looked for."""
    if builder_for(cfg.dataset).load is not None or cfg.reward.path:  # the user's files, a generator, a reward
        try:
            return True, check_task(cfg)
        except VerlGrpoError as e:
            return False, str(e)
    folder = resolve_mirror_dir(cfg.dataset)
    files = builder_for(cfg.dataset).mirror_files
    missing = [f for f in files if not (folder / f).is_file()]
    if cfg.dataset.source == "hub":
        return True, f"source hub ({cfg.dataset.hub_id or 'default id'}); needs network at prepare time"
    if not missing:
        return True, f"mirror {folder}"
    if cfg.dataset.source == "auto" and not mirror_knob(cfg.dataset):
        return True, f"mirror {folder} lacks {', '.join(missing)}; will try the Hugging Face hub"
    return False, missing_mirror_message(cfg.dataset, folder, files, missing)
