"""The schedules of a stateful app: a bounded worker every few minutes, and the daily compaction.

Owns the schedule factories. The worker schedule launches what the lag sensor launches (a
`WorkerTarget`: the store assets, or the pool job) and skips a tick, saying why, while the source
topic does not exist yet, while the consumer group has no lag, or while a worker run is still in
progress. The compaction schedule runs the compaction job (a Spark snapshot of every store) on its
cron; the snapshot sensor covers the time before the first one and any gap.
"""

from typing import Any

from dagster import (
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from dagster_stateful.automation.worker_target import WorkerTarget
from dagster_stateful.core.app import App
from dagster_stateful.core.monitoring.lag import partition_lag
from dagster_stateful.naming import job_name
from dagster_stateful.resources import KafkaResource


def worker_schedule(
    app: App, target: WorkerTarget, every_minutes: int, status: DefaultScheduleStatus
) -> ScheduleDefinition:
    @schedule(
        name=job_name(app, "worker_schedule"),
        job=target.job,
        cron_schedule=f"*/{every_minutes} * * * *",
        default_status=status,
        description=f"A bounded worker of `{app.name}` every {every_minutes} minutes (skipped while the "
        "source topic does not exist yet, while the consumer group has no lag, or while a worker run is still "
        "in progress).",
    )
    def run_worker_on_schedule(context: ScheduleEvaluationContext, kafka: KafkaResource) -> RunRequest | SkipReason:
        clients = kafka.clients()
        partitions = clients.partition_count(app.source)
        if partitions is None:
            return SkipReason(f"source topic {app.source} does not exist yet: nothing to process")
        committed = clients.committed_offsets(app.consumer_group, app.source, range(partitions))
        marks = clients.watermarks(app.source, range(partitions))
        lag = sum(partition_lag(committed.get(p), *marks[p]) for p in range(partitions))
        if lag == 0:
            return SkipReason(
                f"no lag: group {app.consumer_group} has processed every message of {app.source} "
                f"({partitions} partitions); nothing to do"
            )
        running = target.run_in_progress(context.instance)
        if running:
            return SkipReason(f"worker run {running.run_id} is still in progress")
        return target.run_request(None, {"dagster-stateful/lag": str(lag)})

    return run_worker_on_schedule


def compaction_schedule(app: App, compaction: Any, cron: str, status: DefaultScheduleStatus) -> ScheduleDefinition:
    """`compaction` (the app's compaction job, `jobs.compaction_job`) on the cron `cron`."""
    return ScheduleDefinition(
        name=job_name(app, "daily_compaction"),
        job=compaction,
        cron_schedule=cron,
        default_status=status,
        description="Daily snapshot of every store and partitioned table (Spark).",
    )
