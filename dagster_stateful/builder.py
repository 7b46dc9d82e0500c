"""One call builds every Dagster definition of a stateful app.

Owns `build_stateful_definitions`: the app's assets (source topic, changelogs, state stores,
snapshots), asset checks, jobs (provision, worker, restore, Spark restore, clear state,
compaction), the worker and daily compaction schedules and the lag and rebalance sensors, with
the resources they need under the keys `kafka`, `state_store` and `pyspark` (Spark with the
Kafka connector, for the Spark jobs).
"""

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
)

from dagster_stateful.assets import changelog_assets, snapshot_assets, source_topic_spec, store_assets
from dagster_stateful.checks import stateful_checks
from dagster_stateful.core.app import App
from dagster_stateful.jobs import clear_state_job, provision_job, restore_job, spark_restore_job, worker_job
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource
from dagster_stateful.sensors import lag_sensor, rebalance_sensor


def build_stateful_definitions(
    app: App,
    source_partitions: int,
    kafka: KafkaResource,
    state_store: StateStoreResource,
    worker_every_minutes: int | None = 5,
    automation_running: bool = False,
    lag_threshold: int = 1000,
    restore_threshold: int = 1000,
    max_changelog_lag: int = 100_000,
    spark: StatefulSparkResource | None = None,
    compaction_cron: str = "0 3 * * *",
    max_snapshot_age_hours: float = 48.0,
) -> Definitions:
    """Definitions for `app`, whose source topic has `source_partitions` partitions (a check verifies it).

    worker_every_minutes: run a bounded worker on this schedule (None: no schedule).
    automation_running: start the schedule and sensors switched on (otherwise a user turns them on in the UI).
    """
    schedule_status = DefaultScheduleStatus.RUNNING if automation_running else DefaultScheduleStatus.STOPPED
    sensor_status = DefaultSensorStatus.RUNNING if automation_running else DefaultSensorStatus.STOPPED
    worker = worker_job(app)
    assets = [source_topic_spec(app), store_assets(app, source_partitions)]
    jobs = [worker, restore_job(app), clear_state_job(app)]
    schedules = [worker_schedule(app, worker, worker_every_minutes, schedule_status)] if worker_every_minutes else []
    if app.config.use_changelog_topics:
        compaction = define_asset_job(
            job_name(app, "compaction"),
            selection=AssetSelection.assets(*(snapshot_key(app, s) for s in app.stores)),
            description=f"Spark folds the changelogs of `{app.name}` into new snapshots.",
        )
        assets += [changelog_assets(app), snapshot_assets(app)]
        jobs += [provision_job(app), spark_restore_job(app), compaction]
        schedules.append(
            ScheduleDefinition(
                name=job_name(app, "daily_compaction"),
                job=compaction,
                cron_schedule=compaction_cron,
                default_status=schedule_status,
                description="Daily snapshot of every store (Spark).",
            )
        )
    return Definitions(
        assets=assets,
        asset_checks=stateful_checks(app, max_changelog_lag, max_snapshot_age_hours),
        jobs=jobs,
        schedules=schedules,
        sensors=[
            lag_sensor(app, lag_threshold, default_status=sensor_status),
            rebalance_sensor(app, restore_threshold, default_status=sensor_status),
        ],
        resources={
            "kafka": kafka,
            "state_store": state_store,
            "pyspark": spark or StatefulSparkResource(spark_config={"spark.master": "local[*]"}),
        },
    )


def worker_schedule(app: App, worker, every_minutes: int, status: DefaultScheduleStatus):
    @schedule(
        name=job_name(app, "worker_schedule"),
        job=worker,
        cron_schedule=f"*/{every_minutes} * * * *",
        default_status=status,
        description=f"A bounded worker of `{app.name}` every {every_minutes} minutes (skipped while the "
        "source topic does not exist yet).",
    )
    def run_worker_on_schedule(context: ScheduleEvaluationContext, kafka: KafkaResource):
        if kafka.clients().partition_count(app.source) is None:
            return SkipReason(f"source topic {app.source} does not exist yet: nothing to process")
        return RunRequest(run_key=None)

    return run_worker_on_schedule
