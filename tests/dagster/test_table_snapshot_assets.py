"""A partitioned table's store in Dagster: its snapshot asset sits downstream of the table's topic
only, the compaction job materializes it with the stores' (Spark, against the real broker), its
materialization shows where each partition was cut and the decoded rows, and an asset taking it as
an input receives the table as the app's commits left it; its freshness is checked as a store
snapshot's is. A versioned table has no snapshot asset."""

from __future__ import annotations

import time

import orjson
import pandas as pd
import pytest
from dagster import AssetCheckKey, AssetIn, AssetKey, AssetSelection, MaterializeResult, asset, materialize
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce_timed

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.checks import stateful_checks
from dagster_stateful.core import App, Sum
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.naming import job_name, snapshot_key, table_snapshot_key
from dagster_stateful.pipes import SparkPipesResource
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource

PARTITIONS = 2
CUSTOMERS = 20
COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
}


def enriched_app(name: str, source: str, customers: str, **settings) -> App:
    """Orders keyed by customer, enriched with the customer's tier (left join), totalled per customer."""
    app = App(name=name, source=source, stores=["totals"], consumer_config=FAST_GROUP, **FAST_COMMITS, **settings)
    profiles = app.table(customers, name="profiles")
    app.dataframe().join(profiles, how="left", on_merge="keep-right").aggregate(Sum("amount"), name="total")
    return app


def parents(defs, key: AssetKey) -> set[AssetKey]:
    return set(defs.resolve_asset_graph().get(key).parent_keys)


def test_a_tables_snapshot_asset_is_downstream_of_the_tables_topic_alone(tmp_path):
    app = enriched_app("enriched", "orders", "customers", state_dir=tmp_path)
    app.table("customer-history", name="history", history=60_000)
    plain = enriched_app("plain", "orders", "customers", state_dir=tmp_path, use_changelog_topics=False)
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions([app, plain], PARTITIONS, kafka, StateStoreResource(state_dir=str(tmp_path)))
    graph = defs.resolve_asset_graph()
    snapshot = table_snapshot_key(app, "profiles")

    assert snapshot == AssetKey(["enriched", "profiles_table_snapshot"])
    assert parents(defs, snapshot) == {AssetKey(["kafka", "customers"])}
    assert not graph.get(snapshot).child_keys
    assert table_snapshot_key(app, "history") not in graph.get_all_asset_keys(), "a versioned table has none"
    compaction = defs.resolve_job_def(job_name(app, "compaction")).asset_layer.selected_asset_keys
    assert compaction == {snapshot_key(app, "totals"), snapshot}
    # Without changelog topics the stores have no snapshots; the table's topic is its changelog still.
    compaction = defs.resolve_job_def(job_name(plain, "compaction")).asset_layer.selected_asset_keys
    assert compaction == {table_snapshot_key(plain, "profiles")}
    assert parents(defs, table_snapshot_key(plain, "profiles")) == {AssetKey(["kafka", "customers"])}
    checked = {key for checks in stateful_checks(plain) for key in checks.check_keys}
    assert checked == {AssetCheckKey(table_snapshot_key(plain, "profiles"), "snapshot_fresh")}


@pytest.mark.spark
def test_the_compaction_job_snapshots_the_table_and_an_asset_receives_its_rows(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    source, customers = unique_name("orders"), unique_name("customers")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    t0 = int(time.time() * 1000) - 3_600_000
    tiers = [
        (f"c{i % CUSTOMERS}".encode(), None if i % 9 == 4 else orjson.dumps({"tier": f"t{i}"}), t0 + i)
        for i in range(5 * CUSTOMERS)
    ]
    produce_timed(kafka_bootstrap, customers, tiers)
    produce_timed(
        kafka_bootstrap,
        source,
        [(f"c{c}".encode(), orjson.dumps({"amount": 1}), t0 + 10_000) for c in range(CUSTOMERS)],
    )
    late = [(f"c{c}".encode(), orjson.dumps({"tier": "late"}), t0 + 20_000) for c in range(CUSTOMERS)]
    produce_timed(kafka_bootstrap, customers, late)  # after every order: not applied by the commits
    app = enriched_app(unique_name("enriched"), source, customers)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    resources = {"kafka": kafka, "state_store": state_store, "spark": pyspark}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, spark=pyspark)
    bound = state_store.bind(app, kafka)
    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    snapshot = table_snapshot_key(app, "profiles")

    @asset(ins={"profiles": AssetIn(snapshot)})
    def tier_counts(profiles: pd.DataFrame) -> MaterializeResult:
        rows = [{"partition": int(row.partition), "key": row.key, "tier": row.tier} for row in profiles.itertuples()]
        return MaterializeResult(metadata={"rows": rows})

    result = defs.resolve_job_def(job_name(app, "compaction")).execute_in_process()
    reported = materialize([defs.get_assets_def(snapshot), tier_counts], resources=resources, selection=[tier_counts])

    materialized = {m.asset_key: m.metadata for m in result.asset_materializations_for_node(job_name(app, "snapshots"))}
    assert set(materialized) == {snapshot_key(app, "totals"), snapshot}
    metadata = materialized[snapshot]
    positions = {str(d.partition): d.committed_position for d in bound.describe_tables()}
    ends = {str(p): high for p, (_, high) in bound.kafka.watermarks(customers, range(PARTITIONS)).items()}
    assert metadata["committed_table_positions"].value == positions
    assert metadata["end_offsets"].value == positions
    left = {p: ends[p] - (position or 0) for p, position in positions.items()}
    assert metadata["records_left_to_replay"].value == left and all(left.values()), "the late tiers come after"
    kept: dict[str, str | None] = {}
    for key, value, _ in tiers:  # produce order is offset order within a key's partition
        kept[key.decode()] = None if value is None else orjson.loads(value)["tier"]
    expected = {customer: tier for customer, tier in kept.items() if tier is not None}
    assert metadata["keys"].value == metadata["dagster/row_count"].value == len(expected) < CUSTOMERS
    [rows] = [  # as a user reads it
        orjson.loads(orjson.dumps(m.metadata["rows"].value))
        for m in reported.asset_materializations_for_node("tier_counts")
    ]
    assert {row["key"]: row["tier"] for row in rows} == expected
    assert all(row["partition"] in range(PARTITIONS) for row in rows)
    fresh = AssetCheckKey(snapshot, "snapshot_fresh")
    [checks] = [checks for checks in stateful_checks(app) if fresh in checks.check_keys]
    [evaluation] = materialize(
        [checks], resources=resources, selection=AssetSelection.checks(fresh)
    ).get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["snapshot_id"].value == metadata["snapshot_id"].value


@pytest.mark.spark
def test_through_pipes_a_table_no_commit_applied_yet_has_an_empty_snapshot(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    """The table-snapshot command, launched through Dagster Pipes, reports the snapshot it wrote; the
    app has not run, so no commit recorded a position: every partition is cut at the beginning.
    (`spark` puts the test with the others using Spark, so that one Spark runs at a time.)"""
    source, customers = unique_name("orders"), unique_name("customers")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    produce_timed(kafka_bootstrap, customers, [(b"c1", orjson.dumps({"tier": "gold"}), 0)])
    app = enriched_app(unique_name("enriched"), source, customers, use_changelog_topics=False)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    resources = {"kafka": kafka, "state_store": state_store, "spark": SparkPipesResource(master="local[1]")}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store)
    snapshot = table_snapshot_key(app, "profiles")

    result = materialize([defs.get_assets_def(snapshot)], resources=resources)

    [metadata] = [m.metadata for m in result.asset_materializations_for_node(job_name(app, "snapshots"))]
    assert metadata["keys"].value == 0 and metadata["dagster/row_count"].value == 0
    assert metadata["end_offsets"].value == {str(p): 0 for p in range(PARTITIONS)}
    assert metadata["committed_table_positions"].value == {str(p): None for p in range(PARTITIONS)}
    written = partition_of(b"c1", PARTITIONS, "consistent")  # librdkafka's default partitioner
    left = {str(p): int(p == written) for p in range(PARTITIONS)}
    assert metadata["records_left_to_replay"].value == left, "the one record is left to the workers"
