"""Idempotent set-up of a Prefect server for verl-grpo: the process work pool, the tag concurrency limits of the
train tasks (`verl-grpo-train`: trainings on this machine, 1; `verl-grpo-train-cloud`: trainings on cloud GPUs, one
per GPU deployment) and the automations in automations.yaml (created once, matched by name).

Run with PREFECT_API_URL pointing at the server: `python infra/prefect/setup_server.py`.
VERL_GRPO_ZOMBIE_AFTER_S (or --zombie-after) sets how long a flow run may go without a heartbeat before the
zombie automation marks it Crashed (automations.yaml: 90 s); it must exceed PREFECT_FLOWS_HEARTBEAT_FREQUENCY.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker

from verl_grpo.config.env import env_setting, non_negative_int
from verl_grpo.errors import ConfigError

HERE = Path(__file__).resolve().parent
TRAIN_TAG = "verl-grpo-train"  # tasks/train.py TRAIN_CONCURRENCY_TAG
CLOUD_TRAIN_TAG = "verl-grpo-train-cloud"  # tasks/train.py CLOUD_TRAIN_CONCURRENCY_TAG
ZOMBIE_AUTOMATION = "verl-grpo-crash-zombie-runs"


def ensure_work_pool(client, name: str) -> None:
    try:
        client.read_work_pool(name)
        print(f"work pool {name}: exists")
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
        print(f"work pool {name}: created (process)")


def ensure_train_limit(client, tag: str, limit: int) -> None:
    """At most `limit` train task runs of `tag` at once on this server, whatever flow run or deployment they belong
    to."""
    client.create_concurrency_limit(tag=tag, concurrency_limit=limit)
    print(f"tag concurrency limit {tag}: {limit}")


def ensure_automations(client, path: Path, zombie_after: int | None = None) -> None:
    for data in yaml.safe_load(path.read_text())["automations"]:
        if data["name"] == ZOMBIE_AUTOMATION and zombie_after:
            data["trigger"]["within"] = zombie_after
            data["actions"][0]["message"] = f"No heartbeat for {zombie_after} s; the flow-run process is gone."
        automation = AutomationCore.model_validate(data)
        if client.read_automations_by_name(automation.name):
            print(f"automation {automation.name}: exists")
            continue
        client.create_automation(automation)
        print(f"automation {automation.name}: created")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", default="verl-grpo-local")
    parser.add_argument("--train-limit", type=int, default=1, help="trainings at once on this machine")
    parser.add_argument("--cloud-train-limit", type=int, default=3,
                        help="trainings at once on cloud GPUs (default: the three nightly GPU deployments)")
    parser.add_argument("--automations", type=Path, default=HERE / "automations.yaml")
    try:
        zombie_after = env_setting("VERL_GRPO_ZOMBIE_AFTER_S", non_negative_int, 0,
                                   "a whole number of seconds (0: the YAML's)")
    except ConfigError as e:
        sys.exit(f"error (ConfigError): {e}")
    parser.add_argument("--zombie-after", type=int, default=zombie_after,
                        help="seconds without a heartbeat before a flow run is marked Crashed (default: the YAML's)")
    args = parser.parse_args()
    heartbeat = int(os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or 0)
    if args.zombie_after and args.zombie_after <= heartbeat:
        sys.exit(f"VERL_GRPO_ZOMBIE_AFTER_S={args.zombie_after} must exceed PREFECT_FLOWS_HEARTBEAT_FREQUENCY="
                 f"{heartbeat}, else every healthy run is marked Crashed; raise it (e.g. {heartbeat + 30})")
    with get_client(sync_client=True) as client:
        ensure_work_pool(client, args.pool)
        ensure_train_limit(client, TRAIN_TAG, args.train_limit)
        ensure_train_limit(client, CLOUD_TRAIN_TAG, args.cloud_train_limit)
        ensure_automations(client, args.automations, args.zombie_after or None)


if __name__ == "__main__":
    main()
