"""A resume trusts only the store: `restore_latest` leaves exactly the run's latest complete checkpoint on local disk,
in a backend's own directory layout (`LocalCheckpoints`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_grpo.checkpoints import CheckpointStore
    from verl_grpo.contracts import CheckpointRef


@dataclass(frozen=True)
class LocalCheckpoints:
    """A backend's checkpoint directories on local disk: `{root}/{prefix}{step}`."""

    root: Path
    prefix: str

    def step_dir(self, step: int) -> Path:
        return Path(self.root) / f"{self.prefix}{step}"

    def steps(self) -> list[int]:
        out = []
        for p in Path(self.root).glob(f"{self.prefix}*"):
            suffix = p.name[len(self.prefix):]
            if p.is_dir() and suffix.isdigit():
                out.append(int(suffix))
        return sorted(out)


def restore_latest(checkpoints: CheckpointStore, run_id: str, local: LocalCheckpoints,
                   keep_undeletable: bool = False) -> tuple[CheckpointRef, Path] | None:
    """Make `local` hold exactly the store's latest complete checkpoint of the run; its ref and dir, or None.

    Local step dirs other than the restored one are deleted, and files of the restored dir that its manifest does
    not list (an interrupted local save of the same step) are removed, so a resume only ever sees files whose
    sha256 matched the manifest. keep_undeletable: a leftover that cannot be deleted stays (for a backend that
    resumes from the directory it is handed, never from a scan of the root).
    """
    ref = checkpoints.latest_complete(run_id)
    Path(local.root).mkdir(parents=True, exist_ok=True)
    for step in local.steps():
        if ref is None or step != ref.step:
            shutil.rmtree(local.step_dir(step), ignore_errors=keep_undeletable)
    if ref is None:
        return None
    step_dir = local.step_dir(ref.step)
    listed = {entry["path"] for entry in checkpoints.restore(ref, step_dir)["files"]}
    for path in [p for p in step_dir.rglob("*") if p.is_file() and p.relative_to(step_dir).as_posix() not in listed]:
        path.unlink()
    return ref, step_dir
