"""One call builds every Dagster definition of one stateful app, or of several.

Owns `build_stateful_definitions`, which gathers each app's assets (source topic, changelogs,
state stores, snapshots: `assets`), asset checks (`checks`), jobs (provision, worker, restore,
Spark restore, query state, clear state, compaction: `jobs`; bootstrap and transform state:
`state_table_jobs`), schedules and sensors (worker and daily compaction schedules; lag,
rebalance, snapshot and checks sensors: `automation`), with the resources they need under the keys
`kafka`, `state_store` and `spark` (how the Spark jobs run: in process or through Dagster Pipes),
shared by the apps; apps reading one topic share its asset.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import DefaultScheduleStatus, DefaultSensorStatus, Definitions

from dagster_stateful.assets import changelog_assets, snapshot_assets, source_topic_spec, store_assets
from dagster_stateful.automation import (
    checks_sensor,
    compaction_schedule,
    lag_sensor,
    rebalance_sensor,
    snapshot_sensor,
    worker_schedule,
)
from dagster_stateful.automation.worker_target import WorkerTarget, worker_target
from dagster_stateful.checks import stateful_checks
from dagster_stateful.core.app import App
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.jobs import (
    clear_state_job,
    compaction_job,
    provision_job,
    query_state_job,
    restore_job,
    spark_restore_job,
    worker_job,
)
from dagster_stateful.naming import snapshot_keys, store_key
from dagster_stateful.resources import KafkaResource, SparkRunner, StatefulSparkResource, StateStoreResource
from dagster_stateful.state_table_jobs import bootstrap_state_job, transform_state_job
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator


def build_stateful_definitions(
    apps: App | Sequence[App],
    source_partitions: int | Mapping[str, int],
    kafka: KafkaResource,
    state_store: StateStoreResource,
    worker_every_minutes: int | None = 5,
    automation_running: bool = False,
    lag_threshold: int = 1000,
    restore_threshold: int = 1000,
    max_changelog_lag: int = 100_000,
    spark: SparkRunner | None = None,
    compaction_cron: str = "0 3 * * *",
    max_snapshot_age_hours: float = 48.0,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
    check_cron: str | None = "*/10 * * * *",
    pool_size: int = 1,
    standby_replicas: int | None = None,
) -> Definitions:
    """Definitions for one app or several (their names must differ; apps reading the same source
    topic share its asset). `source_partitions`: the source topic's partition count, or the count per
    source topic when the apps read different ones (a check verifies it).

    worker_every_minutes: run a bounded worker on this schedule (None: no schedule).
    automation_running: start the schedule and sensors switched on (otherwise a user turns them on in the UI).
    translator: names the assets and their groups (subclass `StatefulTranslator` to choose your own).
    check_cron: when a sensor evaluates the asset checks (None: only when a user launches them).
    spark: how the snapshot asset and the Spark restore reach Spark: `StatefulSparkResource` (in the
        run's process, `local[*]` by default) or `SparkPipesResource` (a separate command, through Pipes).
    pool_size: workers per worker run (each app's): a pool on this machine, in parallel processes
        sharing the state directory, each with its own static membership (see `App.pool_member`).
    standby_replicas: the standby copies the workers of every app keep (`App(num_standby_replicas=)`;
        None: each app's own). A pool's members keep standbys of other hosts' partitions only.
    """
    apps = [apps] if isinstance(apps, App) else list(apps)
    apps = [_with_standby_replicas(app, standby_replicas) for app in apps]
    names = [app.name for app in apps]
    if not apps or len(set(names)) != len(names):
        raise ConfigurationError(f"build_stateful_definitions needs one or more apps with distinct names, got {names}")
    schedule_status = DefaultScheduleStatus.RUNNING if automation_running else DefaultScheduleStatus.STOPPED
    sensor_status = DefaultSensorStatus.RUNNING if automation_running else DefaultSensorStatus.STOPPED
    parts = _Parts(translator, pool_size)
    readers: dict[str, list[App]] = {}
    for app in apps:
        inputs = (*app.config.global_tables.values(), *app.config.tables.values(), *app.config.joined_streams.values())
        for topic in dict.fromkeys((app.source, *inputs)):
            readers.setdefault(topic, []).append(app)
        partitions = _partitions_of(app, source_partitions)
        target = parts.add_app(
            app, partitions, worker_every_minutes, schedule_status, compaction_cron, max_changelog_lag
        )
        checks = stateful_checks(app, max_snapshot_age_hours, translator, check_cron)
        parts.checks += checks
        if check_cron is not None:
            parts.sensors.append(checks_sensor(app, checks, sensor_status))
        parts.sensors += [
            lag_sensor(app, target, lag_threshold, default_status=sensor_status, translator=translator),
            rebalance_sensor(app, restore_threshold, default_status=sensor_status, translator=translator),
        ]
        if app.config.use_changelog_topics:
            parts.sensors.append(snapshot_sensor(app, max_snapshot_age_hours, default_status=sensor_status))
    return Definitions(
        assets=[source_topic_spec(topic, apps_of_topic, translator) for topic, apps_of_topic in readers.items()]
        + parts.assets,
        asset_checks=parts.checks,
        jobs=parts.jobs,
        schedules=parts.schedules,
        sensors=parts.sensors,
        resources={
            "kafka": kafka,
            "state_store": state_store,
            "spark": spark or StatefulSparkResource(spark_config={"spark.master": "local[*]"}),
        },
    )


def _with_standby_replicas(app: App, replicas: int | None) -> App:
    """`app`, or a copy of it whose workers keep `replicas` standby copies."""
    if replicas is None or replicas == app.config.num_standby_replicas:
        return app
    keeping = app.bind()
    keeping.config = app.config.replace(num_standby_replicas=replicas)
    return keeping


def _partitions_of(app: App, source_partitions: int | Mapping[str, int]) -> int:
    """The partition count of the topic that owns the app's state (its repartition topic's, when its
    `group_by` sets one)."""
    repartition = app.config.repartition
    if repartition is not None and repartition.partitions is not None:
        return repartition.partitions
    if isinstance(source_partitions, int):
        return source_partitions
    if app.source not in source_partitions:
        raise ConfigurationError(
            f"source_partitions gives no partition count for topic {app.source!r}, the source of app {app.name!r}"
        )
    return source_partitions[app.source]


@dataclass
class _Parts:
    """The definitions of the apps, gathered."""

    translator: StatefulTranslator
    pool_size: int
    assets: list[Any] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)
    schedules: list[Any] = field(default_factory=list)
    sensors: list[Any] = field(default_factory=list)

    def add_app(
        self,
        app: App,
        partitions: int,
        worker_every_minutes: int | None,
        status: DefaultScheduleStatus,
        compaction_cron: str,
        max_changelog_lag: int,
    ) -> WorkerTarget:
        """Adds the app's assets, jobs and schedules; returns what its worker schedule and lag sensor launch."""
        translator = self.translator
        worker = worker_job(app, translator, self.pool_size, max_changelog_lag)
        self.assets.append(store_assets(app, partitions, translator, max_changelog_lag, self.pool_size))
        target = worker_target(
            app, worker, [store_key(app, s, translator) for s in app.stores], partitions, self.pool_size
        )
        self.jobs += [worker, restore_job(app, translator), query_state_job(app), clear_state_job(app)]
        if target.job is not worker:
            self.jobs.append(target.job)
        if worker_every_minutes:
            self.schedules.append(worker_schedule(app, target, worker_every_minutes, status))
        if app.config.use_changelog_topics or app.config.repartition is not None:
            self.assets.append(changelog_assets(app, translator))
            self.jobs.append(provision_job(app, translator))
        if snapshot_keys(app, translator):  # the stores' (with changelogs) and the partitioned tables'
            compaction = compaction_job(app, translator)
            self.assets.append(snapshot_assets(app, translator))
            self.jobs.append(compaction)
            self.schedules.append(compaction_schedule(app, compaction, compaction_cron, status))
        if app.config.use_changelog_topics:
            self.jobs += [spark_restore_job(app, translator), bootstrap_state_job(app, translator)]
            self.jobs.append(transform_state_job(app, translator))
        return target
