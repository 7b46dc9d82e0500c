"""The lag and rebalance sensors against real consumer groups on the real broker (the rebalance
sensor leaves the partitions that have standby replicas to the workers that keep them)."""

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from dagster import DagsterInstance, SkipReason, build_sensor_context
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app
from support.kafka_helpers import produce, wait_for

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.core.processing.worker.loop import Worker
from dagster_stateful.naming import job_name, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource

PARTITIONS = 4


@pytest.fixture
def deployment(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, make_orders(200, customers=16))
    app = totals_app(kafka_bootstrap, source, tmp_path / "unbound", unique_name("totals"))
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "here"))
    resources = {"kafka": kafka, "state_store": state_store}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, lag_threshold=100, restore_threshold=50)
    bound = state_store.bind(app, kafka)
    return defs, app, bound, resources


def tick(defs, name, resources, instance, cursor=None):
    """One evaluation of the sensor, in a context that is closed afterwards (an open one leaves its
    instance registered in Dagster's process-wide state, which later definition loads then trip on)."""
    sensor = defs.resolve_sensor_def(name)
    with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        return sensor(context)


def test_lag_sensor_requests_a_worker_run_when_lag_passes_the_threshold(deployment, kafka_bootstrap):
    defs, app, _bound, resources = deployment
    instance = DagsterInstance.ephemeral()
    sensor_name = job_name(app, "lag_sensor")

    result = tick(defs, sensor_name, resources, instance)
    assert len(result.run_requests) == 1, "200 unprocessed messages pass the threshold of 100"
    run_key = result.run_requests[0].run_key
    observed = [e for e in result.asset_events if e.asset_key == store_key(app, "totals")]
    assert sorted(e.partition for e in observed) == [str(p) for p in range(PARTITIONS)]
    assert sum(e.metadata["lag"].value for e in observed) == 200

    again = tick(defs, sensor_name, resources, instance, cursor=result.cursor)
    assert again.run_requests[0].run_key == run_key, "same backlog, same run key: a retry never doubles work"

    instance.create_run_for_job(defs.resolve_job_def(job_name(app, "worker")))
    busy = tick(defs, sensor_name, resources, instance, cursor=again.cursor)
    assert not busy.run_requests and "in progress" in busy.skip_reason.skip_message


def test_lag_sensor_skips_without_lag_and_survives_a_bad_cursor(deployment):
    defs, app, bound, resources = deployment
    bound.run_worker(max_seconds=120)
    instance = DagsterInstance.ephemeral()

    result = tick(defs, job_name(app, "lag_sensor"), resources, instance, cursor="{definitely not json")

    assert not result.run_requests
    assert isinstance(result.skip_reason, SkipReason) and result.skip_reason.skip_message is not None
    assert "total lag 0" in result.skip_reason.skip_message
    assert all(e.metadata["status"].value == "OK" for e in result.asset_events if e.partition is not None)
    assert result.cursor.startswith("{")


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_rebalance_sensor_records_a_join_and_restores_moved_partitions(deployment, kafka_bootstrap, tmp_path):
    defs, app, here, resources = deployment
    elsewhere = here.bind(state_dir=tmp_path / "elsewhere")
    instance = DagsterInstance.ephemeral()
    sensor_name = job_name(app, "rebalance_sensor")
    idle = tick(defs, sensor_name, resources, instance)
    assert "no partition owned elsewhere" in idle.skip_reason.skip_message

    worker_here = here.worker(max_seconds=120, until_caught_up=False)
    worker_elsewhere = elsewhere.worker(max_seconds=120, until_caught_up=False)
    threads = [run_in_thread(worker_here)]
    try:
        wait_for(lambda: worker_here.report.total_processed == 200, 60, "the first worker to process the backlog")
        first = tick(defs, sensor_name, resources, instance, cursor=idle.cursor)
        assert first.asset_events and first.asset_events[0].metadata["members"].value == 1

        threads.append(run_in_thread(worker_elsewhere))  # a second worker joins: partitions move to it

        def settled_with_two_members():
            group = here.kafka.describe_group(app.consumer_group, app.source)
            owners = group.owners()
            return (
                group.state == "STABLE"
                and len(group.members) == 2
                and len(owners) == PARTITIONS
                and len(set(owners.values())) == 2
                and group
            )

        group = wait_for(settled_with_two_members, 60, "the group to settle with both workers")
        moved = sorted(p for m in group.members if m.client_id == elsewhere.worker_client_id for p in m.partitions)
        joined = tick(defs, sensor_name, resources, instance, cursor=first.cursor)
        assert joined.asset_events[0].metadata["rebalances"].value == 1
        assert joined.asset_events[0].metadata["moved_partitions"].value == ", ".join(map(str, moved))

        # Many keys: the write cache folds repeated writes, so changelog growth follows distinct keys.
        produce(kafka_bootstrap, app.source, make_orders(800, customers=400, start=200))

        def all_committed() -> bool:
            highs = here.kafka.watermarks(app.source, range(PARTITIONS))
            committed = here.kafka.committed_offsets(app.consumer_group, app.source, range(PARTITIONS))
            return all(committed[p] == highs[p][1] for p in range(PARTITIONS))

        wait_for(all_committed, 90, "both workers to process and commit the new orders")
        requested = tick(defs, sensor_name, resources, instance, cursor=joined.cursor)
    finally:
        # This machine's worker leaves first: were the other one first, the moved partitions would
        # come back here and be restored by the worker itself.
        for worker, thread in zip((worker_here, worker_elsewhere), threads, strict=False):
            worker.stop.request()
            thread.join(60)
        worker_elsewhere.stop.request()
    assert not any(thread.is_alive() for thread in threads), "both workers stopped"

    assert len(requested.run_requests) == 1
    restore_config = requested.run_requests[0].run_config["ops"][job_name(app, "restore_op")]["config"]
    assert restore_config["partitions"] == moved, "exactly the moved partitions whose local copy is behind"
    behind = {d.partition: d.changelog_lag for d in here.describe_partitions(moved)}
    assert all(lag > 50 for lag in behind.values())

    restored = defs.resolve_job_def(job_name(app, "restore")).execute_in_process(
        instance=instance, run_config=requested.run_requests[0].run_config
    )

    assert restored.success
    after = [d.to_dict() for d in here.describe_partitions(moved)]
    kinds = [
        e.event_specific_data.materialization.description for e in restored.all_events if e.is_step_materialization
    ]
    assert all(d["changelog_lag"] == 0 for d in after), f"the local copies are fresh again: {after} {kinds}"


def test_snapshot_sensor_asks_for_a_first_snapshot_and_for_one_when_the_latest_is_too_old(deployment, tmp_path):
    import time

    from dagster import DagsterRunStatus, RunRequest

    from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore

    _defs, app, bound, resources = deployment
    state_store = StateStoreResource(state_dir=str(tmp_path / "here"), snapshot_root=str(tmp_path / "snapshots"))
    resources = {**resources, "state_store": state_store}
    defs = build_stateful_definitions(app, PARTITIONS, resources["kafka"], state_store, max_snapshot_age_hours=1)
    instance = DagsterInstance.ephemeral()
    name = job_name(app, "snapshot_sensor")
    bound.provision()

    empty = tick(defs, name, resources, instance)
    assert isinstance(empty, SkipReason) and "changelogs are empty" in str(empty.skip_message)

    bound.run_worker(max_seconds=120)
    first = tick(defs, name, resources, instance)
    assert isinstance(first, RunRequest) and first.run_key == "snapshot-totals:none", "no snapshot yet: one now"

    compaction = defs.resolve_job_def(job_name(app, "compaction"))
    instance.create_run_for_job(compaction, status=DagsterRunStatus.STARTED)
    busy = tick(defs, name, resources, instance)
    assert isinstance(busy, SkipReason) and "still in progress" in str(busy.skip_message)

    snapshots = SnapshotStore(str(tmp_path / "snapshots"), app.name, "totals")

    def publish(snapshot_id: str, created_at: float) -> None:
        (tmp_path / "snapshots" / app.name / "totals" / snapshot_id).mkdir(parents=True)
        topic = app.changelog_topic("totals")
        snapshots.write_manifest(SnapshotManifest(app.name, "totals", topic, snapshot_id, created_at, {}, {}))

    publish("snapshot-1", time.time() - 7200)
    stale = tick(defs, name, resources, DagsterInstance.ephemeral())
    assert isinstance(stale, RunRequest) and stale.run_key == "snapshot-totals:snapshot-1", "older than an hour"
    publish("snapshot-2", time.time())
    fresh = tick(defs, name, resources, DagsterInstance.ephemeral())
    assert isinstance(fresh, SkipReason) and "younger than 1 h" in str(fresh.skip_message)


def test_with_standbys_a_run_materializes_where_the_copies_are_the_sensor_leaves_them_and_a_query_reads_the_freshest(
    kafka_bootstrap, unique_name, tmp_path
):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, make_orders(200, customers=16))
    app = totals_app(kafka_bootstrap, source, tmp_path / "unbound", unique_name("totals"), num_standby_replicas=1)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "here"))
    resources = {"kafka": kafka, "state_store": state_store}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, restore_threshold=50)
    here = state_store.bind(app, kafka)
    elsewhere = here.bind(state_dir=tmp_path / "elsewhere")
    other_worker = elsewhere.worker(max_seconds=120, until_caught_up=False)
    threads = [run_in_thread(other_worker)]
    runs: list = []
    worker_run = {"ops": {job_name(app, "run_worker_op"): {"config": {"max_seconds": 45, "until_caught_up": False}}}}
    threads.append(
        threading.Thread(
            target=lambda: runs.append(
                defs.resolve_job_def(job_name(app, "worker")).execute_in_process(
                    instance=DagsterInstance.ephemeral(), resources=resources, run_config=worker_run
                )
            ),
            daemon=True,
        )
    )
    threads[-1].start()
    try:
        group = wait_for(lambda: _stable_with_both(here, elsewhere), 60, "the group to settle with both workers")
        moved = sorted(p for m in group.members if m.client_id == elsewhere.worker_client_id for p in m.partitions)
        produce(kafka_bootstrap, app.source, make_orders(800, customers=400, start=200))
        wait_for(lambda: _all_committed(here), 90, "both workers to process and commit the new orders")
        wait_for(
            lambda: all(d.changelog_lag == 0 and d.changelog_high > 0 for d in here.describe_partitions(moved)),
            90,
            "this machine's worker to keep standbys of the other worker's partitions up to date",
        )
        result = tick(defs, job_name(app, "rebalance_sensor"), resources, DagsterInstance.ephemeral())
        key = next(f"c{i}" for i in range(400) if partition_of(f"c{i}".encode(), PARTITIONS, "consistent") in moved)
        query_config = {"store": "totals", "key": key, "partitioner": "consistent"}
        query = defs.resolve_job_def(job_name(app, "query_state")).execute_in_process(
            instance=DagsterInstance.ephemeral(),
            resources=resources,
            run_config={"ops": {job_name(app, "query_state_op"): {"config": query_config}}},
        )
        threads[-1].join(90)
    finally:
        other_worker.stop.request()
        for thread in threads:
            thread.join(60)

    assert not result.run_requests, result
    assert f"partitions {moved} have standby replicas" in result.skip_reason.skip_message
    [output] = [e for e in query.all_events if e.event_type_value == "STEP_OUTPUT"]
    answer = output.step_output_data.metadata
    every_order = make_orders(200, customers=16) + make_orders(800, customers=400, start=200)
    assert [row["value"] for row in value_of(answer, "state")] == [expected_totals(every_order)[key]]
    copies = value_of(answer, "copies")
    assert {copy["role"] for copy in copies} == {"active", "standby"}, copies
    assert value_of(answer, "answered_by") == copies[0] and copies[0]["changelog_records_behind"] == 0, copies

    [run] = runs
    stores = [e.step_materialization_data.materialization for e in run.all_events if e.is_step_materialization]
    materialized = {int(m.partition): m.metadata for m in stores if m.asset_key == store_key(app, "totals")}
    kept_here = set(range(PARTITIONS)) - set(moved)
    assert kept_here <= set(materialized), "the run materializes the partitions it processed"
    for partition in kept_here:
        assert value_of(materialized[partition], "active_copy") == here.worker_client_id
        [standby] = value_of(materialized[partition], "standby_copies")
        assert standby["member"] == elsewhere.worker_client_id, standby
        assert 0 <= standby["changelog_records_behind"] <= 50, f"partition {partition}'s standby is warm: {standby}"


def value_of(metadata: Mapping[str, Any], name: str) -> Any:
    """A metadata entry's plain value (JSON, text or number)."""
    return metadata[name].value


def _all_committed(app) -> bool:
    highs = app.kafka.watermarks(app.source, range(PARTITIONS))
    committed = app.kafka.committed_offsets(app.consumer_group, app.source, range(PARTITIONS))
    return all(committed[p] == highs[p][1] for p in range(PARTITIONS))


def _stable_with_both(here, elsewhere):
    group = here.kafka.describe_group(here.consumer_group, here.source)
    owners = {m.client_id for m in group.members if m.partitions}
    if group.state == "STABLE" and owners == {here.worker_client_id, elsewhere.worker_client_id}:
        return group
    return None
