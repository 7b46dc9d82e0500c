"""The rebalance sensor: watches the app's consumer group and keeps this machine's copies of moved
partitions fresh, as Kafka Streams' standby replicas do.

Owns the sensor factory. Each tick describes the group (state, members, which member owns which
partition; a member is named by its client.id, which says the host and state directory it runs
with). A change of the non-empty assignment is a rebalance: it is recorded as an observation of
the state stores with a running count. Partitions owned by a worker elsewhere (another host or
state directory) are watched: when this machine's copy (read from its `.checkpoint` file, without
opening RocksDB) falls behind the changelog by more than the threshold, a restore run is requested
for exactly those partitions. A group with no member (bounded workers between runs) is idle, not
rebalancing. Partitions with standby replicas (`num_standby_replicas`, placed as the workers place
them) are left to the workers that keep them.
"""

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_stateful.automation.cursor import dump_cursor, load_cursor
from dagster_stateful.automation.worker_target import IN_PROGRESS
from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.descriptions import GroupDescription
from dagster_stateful.core.processing.standbys.placement import group_standby_placement
from dagster_stateful.naming import job_name, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator


def rebalance_sensor(
    app: App,
    restore_threshold: int = 1000,
    minimum_interval_seconds: int = 15,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
):
    restore = job_name(app, "restore")

    @sensor(
        name=job_name(app, "rebalance_sensor"),
        job_name=restore,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Rebalances of app `{app.name}`'s consumer group; restores this machine's copies of "
        f"partitions owned elsewhere once they are {restore_threshold}+ changelog records behind.",
    )
    def rebalance(context: SensorEvaluationContext, kafka: KafkaResource, state_store: StateStoreResource):
        bound = state_store.bind(app, kafka)
        cursor = load_cursor(context.cursor)
        previous = _owners_from(cursor.get("owners"))
        counted = cursor.get("rebalances")
        rebalances = counted if isinstance(counted, int) else 0
        group = bound.kafka.describe_group(app.consumer_group, app.source)
        owners = {p: member.client_id for member in group.members for p in member.partitions}
        events, moved = [], []
        if owners and owners != previous:
            moved = sorted(p for p, owner in owners.items() if previous.get(p) != owner)
            rebalances += 1 if previous else 0
            events = [
                AssetObservation(
                    asset_key=store_key(app, store, translator),
                    metadata={
                        "group_state": group.state,
                        "members": len(group.members),
                        "rebalances": rebalances,
                        "moved_partitions": ", ".join(map(str, moved)) or "none",
                        "assignment": {str(p): owner for p, owner in sorted(owners.items())},
                    },
                )
                for store in app.stores
            ]
            context.log.info(
                "Group %s: assignment changed (%s); moved partitions %s", app.consumer_group, group.state, moved
            )
        new_cursor = dump_cursor(
            {"owners": {str(p): o for p, o in (owners or previous).items()}, "rebalances": rebalances}
        )
        with_standbys = _partitions_with_standbys(group, app.config.num_standby_replicas)
        owned_elsewhere = sorted(p for p, owner in owners.items() if owner != bound.worker_client_id)
        elsewhere = [p for p in owned_elsewhere if p not in with_standbys]
        stale = _stale_partitions(bound, elsewhere, restore_threshold)
        if not stale:
            reason = f"group {group.state} with {len(group.members)} member(s); " + (
                f"{len(elsewhere)} partition(s) owned elsewhere, local copies within {restore_threshold} records"
                if elsewhere
                else "no partition owned elsewhere"
            )
            kept = sorted(set(owned_elsewhere) & with_standbys)
            if kept:
                reason += f"; partitions {kept} have standby replicas, which the workers keep warm"
            return SensorResult(skip_reason=SkipReason(reason), asset_events=events, cursor=new_cursor)
        if context.instance.get_runs(RunsFilter(job_name=restore, statuses=IN_PROGRESS), limit=1):
            return SensorResult(
                skip_reason=SkipReason(f"partitions {sorted(stale)} are behind but a restore run is in progress"),
                asset_events=events,
                cursor=new_cursor,
            )
        run_key = "restore-" + "-".join(f"{p}:{high}" for p, high in sorted(stale.items()))
        request = RunRequest(
            run_key=run_key,
            run_config={
                "ops": {
                    job_name(app, "restore_op"): {
                        "config": {"partitions": sorted(stale), "from_scratch": False, "skip_locked": True}
                    }
                }
            },
            tags={"dagster-stateful/trigger": "rebalance", "dagster-stateful/partitions": ",".join(map(str, stale))},
        )
        return SensorResult(run_requests=[request], asset_events=events, cursor=new_cursor)

    return rebalance


def _owners_from(raw: object) -> dict[int, str]:
    if not isinstance(raw, dict):
        return {}
    return {int(p): str(owner) for p, owner in raw.items() if str(p).isdigit()}


def _partitions_with_standbys(group: GroupDescription, replicas: int) -> set[int]:
    """The partitions whose standby replicas the group's workers keep (`num_standby_replicas`)."""
    if not replicas:
        return set()
    return {partition for partition, holders in group_standby_placement(group.members, replicas).items() if holders}


def _stale_partitions(app: App, partitions: list[int], threshold: int) -> dict[int, int]:
    """Partition -> changelog high watermark, for local copies (partitions once held here) more than
    `threshold` records behind."""
    if not partitions or not app.config.use_changelog_topics:
        return {}
    stale: dict[int, int] = {}
    for store in app.stores:
        marks = app.kafka.watermarks(app.changelog_topic(store), partitions)
        for partition in partitions:
            checkpoint = app.state.read_checkpoint(store, partition)
            if checkpoint is None or checkpoint.changelog_offset is None:
                continue  # never held here: nothing to keep fresh
            high = marks[partition][1]
            if high - checkpoint.changelog_offset > threshold:
                stale[partition] = max(stale.get(partition, 0), high)
    return stale
