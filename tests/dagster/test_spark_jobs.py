"""Spark through Dagster: the snapshot asset, a sensor-triggered restore taking the planned path,
and the Spark bulk restore, each verified against a changelog replay."""

import threading

import orjson
import pytest
from dagster import AssetSelection, DagsterInstance, build_sensor_context, materialize
from support.core_helpers import store_content
from support.kafka_helpers import create_topic, produce, wait_for

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.checks import stateful_checks
from dagster_stateful.core import App, State
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource

pytestmark = pytest.mark.spark
PARTITIONS = 2


def remember(event: dict, state: State) -> None:
    state.set("last", event)


def events(start: int, count: int, users: int) -> list[tuple[bytes, bytes]]:
    return [(f"user-{i % users:05d}".encode(), orjson.dumps({"n": i})) for i in range(start, start + count)]


@pytest.fixture
def deployment(spark, kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("events")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    app = App(
        name=unique_name("last"),
        source=source,
        stores=["last"],
        kafka=kafka_bootstrap,
        commit_interval=0.5,
        consumer_config={"session.timeout.ms": 6000},
    )
    app.dataframe().update(remember, stateful=True)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "here"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    resources = {"kafka": kafka, "state_store": state_store, "spark": pyspark}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, restore_threshold=100, spark=pyspark)
    here = state_store.bind(app, kafka)
    return defs, app, here, resources


def materialize_snapshot(defs, app, resources):
    result = materialize([defs.get_assets_def(snapshot_key(app, "last"))], resources=resources)
    return result.asset_materializations_for_node(job_name(app, "snapshots"))[0].metadata


def verification(app, resources):
    [store_checks] = stateful_checks(app)
    [key] = [key for key in store_checks.check_keys if key.name == "matches_changelog_replay"]
    [evaluation] = materialize(
        [store_checks], resources=resources, selection=AssetSelection.checks(key)
    ).get_asset_check_evaluations()
    return evaluation


def test_snapshot_asset_materializes_with_spark(deployment, kafka_bootstrap):
    defs, app, here, resources = deployment
    produce(kafka_bootstrap, app.source, events(0, 500, users=300))
    here.run_worker(max_seconds=120)

    metadata = materialize_snapshot(defs, app, resources)

    assert metadata["keys"].value == 300
    latest = SnapshotStore(resources["state_store"].snapshot_root, app.name, "last").latest()
    assert latest is not None, "the materialization wrote a snapshot"
    assert metadata["snapshot_id"].value == latest.snapshot_id
    assert metadata["sst_image"].value is True
    assert metadata["sst_image_files"].value == sum(len(files) for files in latest.sst_image.values()) > 0
    assert latest.end_offsets == {
        p: h for p, (_, h) in here.kafka.watermarks(app.changelog_topic("last"), range(PARTITIONS)).items()
    }


def test_sensor_triggered_restore_takes_the_planned_snapshot_path(deployment, kafka_bootstrap, tmp_path):
    defs, app, here, resources = deployment
    elsewhere = here.bind(state_dir=tmp_path / "elsewhere")
    produce(kafka_bootstrap, app.source, events(0, 200, users=200))
    instance = DagsterInstance.ephemeral()
    sensor = defs.resolve_sensor_def(job_name(app, "rebalance_sensor"))
    worker_here = here.worker(max_seconds=120, until_caught_up=False)
    worker_elsewhere = elsewhere.worker(max_seconds=120, until_caught_up=False)
    threads = [threading.Thread(target=worker_here.run, daemon=True)]
    threads[0].start()
    try:
        wait_for(lambda: worker_here.report.total_processed == 200, 60, "the first worker to process the backlog")
        with build_sensor_context(instance=instance, resources=resources) as context:
            first = sensor(context)
        threads.append(threading.Thread(target=worker_elsewhere.run, daemon=True))
        threads[1].start()
        group = wait_for(
            lambda: (
                (g := here.kafka.describe_group(app.consumer_group, app.source)).state == "STABLE"
                and len(set(g.owners().values())) == 2
                and len(g.owners()) == PARTITIONS
                and g
            ),
            60,
            "both workers to own partitions",
        )
        moved = sorted(p for m in group.members if m.client_id == elsewhere.worker_client_id for p in m.partitions)
        produce(kafka_bootstrap, app.source, events(200, 3000, users=2000))

        def all_committed() -> bool:
            highs = here.kafka.watermarks(app.source, range(PARTITIONS))
            committed = here.kafka.committed_offsets(app.consumer_group, app.source, range(PARTITIONS))
            return all(committed[p] == highs[p][1] for p in range(PARTITIONS))

        wait_for(all_committed, 90, "the new events to be processed and committed")
        materialize_snapshot(defs, app, resources)  # the daily compaction, say
        with build_sensor_context(instance=instance, cursor=first.cursor, resources=resources) as context:
            requested = sensor(context)
    finally:
        for worker, thread in zip(
            (worker_here, worker_elsewhere), threads, strict=False
        ):  # this machine's worker leaves first
            worker.stop.request()
            thread.join(60)
        worker_elsewhere.stop.request()

    [request] = requested.run_requests
    run = defs.resolve_job_def(job_name(app, "restore")).execute_in_process(
        instance=instance, run_config=request.run_config
    )
    assert run.success
    restored = [e.event_specific_data.materialization for e in run.all_events if e.is_step_materialization]
    assert sorted(int(m.partition) for m in restored) == moved
    for materialization in restored:
        assert materialization.metadata["restore_path"].value == "snapshot"
        assert "snapshot" in materialization.metadata["restore_reason"].value
        assert materialization.metadata["changelog_lag"].value == 0
    check = verification(app, resources)
    assert check.passed and check.metadata["partitions_compared"].value == PARTITIONS


def test_spark_bulk_restore_equals_a_replay_and_the_worker_continues(deployment, kafka_bootstrap):
    defs, app, here, resources = deployment
    produce(kafka_bootstrap, app.source, events(0, 1500, users=1000))
    here.run_worker(max_seconds=120)
    materialize_snapshot(defs, app, resources)
    produce(kafka_bootstrap, app.source, events(1500, 100, users=1000))
    here.run_worker(max_seconds=120)  # a tail past the snapshot

    run = defs.resolve_job_def(job_name(app, "spark_restore")).execute_in_process(
        instance=DagsterInstance.ephemeral(),
        run_config={
            "ops": {
                job_name(app, "spark_restore_op"): {
                    "config": {"partitions": list(range(PARTITIONS)), "from_scratch": True, "method": "spark"}
                }
            }
        },
    )

    assert run.success
    restored = [e.event_specific_data.materialization for e in run.all_events if e.is_step_materialization]
    assert {m.metadata["restore_path"].value for m in restored} == {"spark"}
    assert verification(app, resources).passed
    assert len(store_content(here, "last", PARTITIONS)) == 1000
    produce(kafka_bootstrap, app.source, [(b"user-00007", orjson.dumps({"n": "after"}))])
    assert here.run_worker(max_seconds=120).total_processed == 1
    assert orjson.loads(store_content(here, "last", PARTITIONS)[(b"user-00007", b"last")]) == {"n": "after"}
