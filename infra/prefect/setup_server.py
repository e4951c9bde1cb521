"""Idempotent set-up of a Prefect server for verl-grpo: the process work pool, the `verl-grpo-train` tag
concurrency limit and the automations in automations.yaml (created once, matched by name).

Run with PREFECT_API_URL pointing at the server: `python infra/prefect/setup_server.py`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker

HERE = Path(__file__).resolve().parent
TRAIN_TAG = "verl-grpo-train"


def ensure_work_pool(client, name: str) -> None:
    try:
        client.read_work_pool(name)
        print(f"work pool {name}: exists")
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
        print(f"work pool {name}: created (process)")


def ensure_train_limit(client, limit: int) -> None:
    """At most `limit` train task runs at once on this server, whatever flow run or deployment they belong to."""
    client.create_concurrency_limit(tag=TRAIN_TAG, concurrency_limit=limit)
    print(f"tag concurrency limit {TRAIN_TAG}: {limit}")


def ensure_automations(client, path: Path) -> None:
    for data in yaml.safe_load(path.read_text())["automations"]:
        automation = AutomationCore.model_validate(data)
        if client.read_automations_by_name(automation.name):
            print(f"automation {automation.name}: exists")
            continue
        client.create_automation(automation)
        print(f"automation {automation.name}: created")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", default="verl-grpo-local")
    parser.add_argument("--train-limit", type=int, default=1)
    parser.add_argument("--automations", type=Path, default=HERE / "automations.yaml")
    args = parser.parse_args()
    with get_client(sync_client=True) as client:
        ensure_work_pool(client, args.pool)
        ensure_train_limit(client, args.train_limit)
        ensure_automations(client, args.automations)


if __name__ == "__main__":
    main()
