"""The snapshot sensor: asks for a Spark snapshot of an app's stores when one has none or its latest is too old.

Owns the sensor factory. The daily compaction schedule keeps snapshots fresh once there are
some; this sensor covers the time before (a new deployment would otherwise wait for the first
scheduled compaction, its snapshot checks failing until then) and any gap after (a schedule
switched off, a failed run). It asks only when the changelogs hold something to snapshot, never
while a compaction run is in progress, and its run key names the snapshot it replaces, so a
retried tick never starts a second one.
"""

from dagster import DefaultSensorStatus, RunRequest, RunsFilter, SensorEvaluationContext, SkipReason, sensor

from dagster_stateful.automation.worker_target import IN_PROGRESS
from dagster_stateful.core.app import App
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.naming import job_name
from dagster_stateful.resources import KafkaResource, StateStoreResource


def snapshot_sensor(
    app: App,
    max_snapshot_age_hours: float = 48.0,
    minimum_interval_seconds: int = 60,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
):
    compaction = job_name(app, "compaction")

    @sensor(
        name=job_name(app, "snapshot_sensor"),
        job_name=compaction,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Requests a Spark snapshot of `{app.name}`'s stores when a store has none yet, or its latest "
        f"is older than {max_snapshot_age_hours:g} hours, and its changelog holds records.",
    )
    def snapshots(context: SensorEvaluationContext, kafka: KafkaResource, state_store: StateStoreResource):
        if not state_store.snapshot_root:
            return SkipReason("snapshots are not configured (the state_store resource has no snapshot_root)")
        stale = _stale_stores(app, state_store.snapshot_root, max_snapshot_age_hours)
        if not stale:
            return SkipReason(f"every store of {app.name} has a snapshot younger than {max_snapshot_age_hours:g} h")
        with_records = [store for store in stale if _changelog_holds_records(app, kafka, store)]
        if not with_records:
            return SkipReason(f"stores {sorted(stale)} have no recent snapshot, but their changelogs are empty")
        running = context.instance.get_runs(RunsFilter(job_name=compaction, statuses=IN_PROGRESS), limit=1)
        if running:
            return SkipReason(f"compaction run {running[0].run_id} is still in progress")
        replaced = ",".join(f"{store}:{stale[store] or 'none'}" for store in sorted(with_records))
        return RunRequest(run_key=f"snapshot-{replaced}", tags={"dagster-stateful/trigger": "snapshot-age"})

    return snapshots


def _stale_stores(app: App, root: str, max_age_hours: float) -> dict[str, str | None]:
    """Stores with no snapshot, or only one older than `max_age_hours`: their latest snapshot id (None: none)."""
    stale: dict[str, str | None] = {}
    for store in app.stores:
        latest = SnapshotStore(root, app.name, store).latest()
        if latest is None or latest.age_seconds > max_age_hours * 3600:
            stale[store] = None if latest is None else latest.snapshot_id
    return stale


def _changelog_holds_records(app: App, kafka: KafkaResource, store: str) -> bool:
    clients = kafka.clients()
    topic = app.changelog_topic(store)
    partitions = clients.partition_count(topic)
    if not partitions:
        return False
    return any(high > low for low, high in clients.watermarks(topic, range(partitions)).values())
