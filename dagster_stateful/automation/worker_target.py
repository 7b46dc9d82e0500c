"""What an app's worker schedule and lag sensor launch, and how they see a worker run in progress.

Owns `WorkerTarget`. With one worker per run, they materialize the app's store assets: every
partition in one run (one bounded worker joining the consumer group), so each store's page lists
the schedule and the sensor under its automation. With a pool (`pool_size` > 1) they launch the
pool job, whose run holds several workers, and each store's description names them instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    define_asset_job,
)

from dagster_stateful.assets import kafka_partitions
from dagster_stateful.core.app import App
from dagster_stateful.naming import job_name

IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


@dataclass(frozen=True)
class WorkerTarget:
    job: Any
    """The job the schedule and the sensor launch (a pool job, or the store assets' job)."""
    partitions: int | None
    """The store assets' partition count when `job` materializes them (one run covers them all)."""
    worker_jobs: tuple[str, ...]
    """Every job whose runs are workers of the app: none starts while one of them runs."""

    def run_request(self, run_key: str | None, tags: Mapping[str, str]) -> RunRequest:
        if self.partitions is not None:
            tags = {**tags, PARTITION_RANGE_START_TAG: "0", PARTITION_RANGE_END_TAG: str(self.partitions - 1)}
        return RunRequest(run_key=run_key, tags=dict(tags))

    def run_in_progress(self, instance: DagsterInstance) -> DagsterRun | None:
        for name in self.worker_jobs:
            running = instance.get_runs(RunsFilter(job_name=name, statuses=IN_PROGRESS), limit=1)
            if running:
                return running[0]
        return None


def worker_target(
    app: App, worker_job: Any, store_keys: list[AssetKey], partitions: int, pool_size: int
) -> WorkerTarget:
    """What to launch for `app`: its store assets unless a run holds a pool of workers."""
    if pool_size > 1:
        return WorkerTarget(worker_job, None, (worker_job.name,))
    stores_job = define_asset_job(
        job_name(app, "store_worker"),
        selection=AssetSelection.assets(*store_keys),
        partitions_def=kafka_partitions(partitions),
        description=f"Materialize every partition of the stores of `{app.name}` in one run: one bounded worker in "
        "its consumer group (what the worker schedule and the lag sensor launch).",
    )
    return WorkerTarget(stores_job, partitions, (stores_job.name, worker_job.name))
