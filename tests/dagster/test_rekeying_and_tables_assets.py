"""A re-keying app in Dagster: its repartition topic is an asset between the source and the
changelogs (no edge that does not exist), provisioned with them; its stores run and record like
any other; the lag sensor watches both topics it consumes."""

from __future__ import annotations

import orjson
import pytest
from dagster import AssetKey, DagsterInstance, build_sensor_context, materialize
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App, Sum
from dagster_stateful.naming import changelog_key, job_name, snapshot_key, source_key, store_key, table_store_key
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource
from dagster_stateful.translator import StatefulTranslator

PARTITIONS = 3
ORDERS = 600
REGIONS = 5


def region_app(source: str, name: str, state_dir, partitions: int | None = None) -> App:
    app = App(
        name=name, source=source, stores=["totals"], state_dir=state_dir, consumer_config=FAST_GROUP, **FAST_COMMITS
    )
    app.dataframe().group_by("region", partitions=partitions).aggregate(Sum("amount"), name="total")
    return app


def orders() -> list[tuple[bytes, bytes]]:
    return [
        (f"c{i % 40}".encode(), orjson.dumps({"region": f"r{i % 40 % REGIONS}", "amount": 1 + i % 4}))
        for i in range(ORDERS)
    ]


def deps_of(defs, key: AssetKey) -> set[AssetKey]:
    return set(defs.resolve_asset_graph().get(key).parent_keys)


def test_the_repartition_topic_sits_between_the_source_and_the_changelogs(tmp_path):
    app = region_app("orders", "regions", tmp_path, partitions=6)
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions(app, PARTITIONS, kafka, StateStoreResource(state_dir=str(tmp_path)))
    repartition = AssetKey(["regions", "region_repartition"])

    assert deps_of(defs, repartition) == {source_key(app)}
    assert deps_of(defs, changelog_key(app, "totals")) == {repartition}
    assert deps_of(defs, store_key(app, "totals")) == {changelog_key(app, "totals")}
    store = defs.get_assets_def(store_key(app, "totals"))
    assert store.partitions_def is not None
    assert len(store.partitions_def.get_partition_keys()) == 6, "the stores have the repartition topic's partitions"


@pytest.fixture
def deployment(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce(kafka_bootstrap, source, orders())
    app = region_app(source, unique_name("regions"), tmp_path / "unbound")
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"))
    resources = {"kafka": kafka, "state_store": state_store}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, lag_threshold=100)
    return defs, app, state_store.bind(app, kafka), resources


def tick(defs, name, resources, instance, cursor=None):
    with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        return defs.resolve_sensor_def(name)(context)


def test_provisioning_records_the_repartition_topic_and_the_lag_sensor_watches_both_topics(deployment):
    defs, app, bound, resources = deployment
    instance = DagsterInstance.ephemeral()
    repartition = AssetKey([app.name.replace("-", "_"), "region_repartition"])

    provisioned = materialize([defs.get_assets_def(repartition)], resources=resources, instance=instance)
    recorded = {
        m.asset_key: m.metadata for m in provisioned.asset_materializations_for_node(job_name(app, "changelogs"))
    }
    assert recorded[repartition]["status"].value == "created"
    assert recorded[repartition]["partitions"].value == PARTITIONS

    before = tick(defs, job_name(app, "lag_sensor"), resources, instance)
    assert len(before.run_requests) == 1, "the source's 600 orders pass the threshold"
    totals = {e.asset_key: e.metadata["total_lag"].value for e in before.asset_events if e.partition is None}
    assert totals == {source_key(app): ORDERS, repartition: 0}

    result = materialize(
        [defs.get_assets_def(store_key(app, "totals"))],
        resources=resources,
        instance=instance,
        tags={"dagster/asset_partition_range_start": "0", "dagster/asset_partition_range_end": str(PARTITIONS - 1)},
    )
    stored = next(
        m
        for m in result.asset_materializations_for_node(job_name(app, "stores"))
        if m.asset_key == store_key(app, "totals")
    )
    assert stored.metadata["lag_left"].value == 0 and stored.metadata["stop_reason"].value == "caught_up"
    expected: dict[str, int] = {}
    for _, value in orders():
        order = orjson.loads(value)
        expected[order["region"]] = expected.get(order["region"], 0) + order["amount"]
    with bound.read_state("totals") as reader:
        assert {entry.message_key: entry.value for entry in reader.items()} == expected

    after = tick(defs, job_name(app, "lag_sensor"), resources, instance, cursor=before.cursor)
    assert not after.run_requests and "total lag 0" in after.skip_reason.skip_message
    totals = {e.asset_key: e.metadata["total_lag"].value for e in after.asset_events if e.partition is None}
    assert totals == {source_key(app): 0, repartition: 0}


@pytest.mark.spark
def test_a_re_keyed_store_is_snapshotted_by_spark_against_the_repartition_topics_offsets(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce(kafka_bootstrap, source, orders())
    app = region_app(source, unique_name("regions"), tmp_path / "unbound")
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    resources = {"kafka": kafka, "state_store": state_store, "spark": pyspark}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, spark=pyspark)
    bound = state_store.bind(app, kafka)
    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    with bound.read_state("totals") as reader:
        expected = {entry.message_key: entry.value for entry in reader.items()}

    snapshot = materialize([defs.get_assets_def(snapshot_key(app, "totals"))], resources=resources)
    metadata = snapshot.asset_materializations_for_node(job_name(app, "snapshots"))[0].metadata
    committed = bound.kafka.committed_offsets(app.consumer_group, app.config.task_topic, range(PARTITIONS))
    assert metadata["keys"].value == REGIONS
    assert metadata["committed_source_offsets"].value == {str(p): offset for p, offset in committed.items()}
    bound.clear_state()
    restored = bound.restore_partitions(range(PARTITIONS), method="snapshot")

    assert {r.plan.path.value for r in restored} == {"snapshot"}
    with bound.read_state("totals") as reader:
        assert {entry.message_key: entry.value for entry in reader.items()} == expected


def test_a_global_tables_topic_is_an_asset_upstream_of_what_its_join_feeds(tmp_path):
    """Joined before group_by, the table's rows go into the repartition topic, not straight into the stores."""
    joining = App(name="tiers", source="orders", stores=["totals"], state_dir=tmp_path)
    customers = joining.global_table("customers")
    joining.dataframe().join(customers, on="customer").group_by("tier").aggregate(Sum("amount"))
    after = App(name="late-join", source="orders", stores=["totals"], state_dir=tmp_path)
    regions = after.global_table("regions")
    after.dataframe().group_by("region").join(regions, on="region").aggregate(Sum("amount"))
    plain = App(name="counts", source="customers", stores=["counts"], state_dir=tmp_path)
    plain.dataframe().aggregate(Sum("amount"))
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    apps = [joining, after, plain]
    defs = build_stateful_definitions(apps, PARTITIONS, kafka, StateStoreResource(state_dir=str(tmp_path)))
    topic = AssetKey(["kafka", "customers"])
    repartition = StatefulTranslator().get_repartition_key(joining)

    assert deps_of(defs, repartition) == {source_key(joining), topic}
    assert deps_of(defs, store_key(joining, "totals")) == {changelog_key(joining, "totals")}
    assert AssetKey(["kafka", "regions"]) in deps_of(defs, store_key(after, "totals"))
    spec = defs.resolve_asset_graph().get(topic)
    assert "read by apps `tiers`, `counts` (as a global table by `tiers`)" in (spec.description or "")


def test_a_partitioned_tables_topic_is_an_asset_upstream_of_the_stores_that_join_with_it(tmp_path):
    joining = App(name="enriched", source="orders", stores=["totals"], state_dir=tmp_path)
    profiles = joining.table("profiles", history=60_000)
    joining.dataframe().join(profiles).aggregate(Sum("amount"))
    other = App(name="plain", source="orders", stores=["counts"], state_dir=tmp_path)
    other.dataframe().aggregate(Sum("amount"))
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions([joining, other], PARTITIONS, kafka, StateStoreResource(state_dir=str(tmp_path)))
    topic = AssetKey(["kafka", "profiles"])

    assert deps_of(defs, store_key(joining, "totals")) == {changelog_key(joining, "totals"), topic}
    assert topic not in deps_of(defs, store_key(other, "counts"))  # no edge that does not exist
    spec = defs.resolve_asset_graph().get(topic)
    assert "read by app `enriched` (as a partitioned table by `enriched`)" in (spec.description or "")


def test_a_partitioned_table_joined_before_group_by_feeds_the_repartition_topic(tmp_path):
    app = App(name="tiers", source="orders", stores=["totals"], state_dir=tmp_path)
    app.dataframe().join(app.table("customers")).group_by("tier").aggregate(Sum("amount"))
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions([app], PARTITIONS, kafka, StateStoreResource(state_dir=str(tmp_path)))
    topic = AssetKey(["kafka", "customers"])

    assert deps_of(defs, StatefulTranslator().get_repartition_key(app)) == {source_key(app), topic}
    assert deps_of(defs, store_key(app, "totals")) == {changelog_key(app, "totals")}
    assert deps_of(defs, table_store_key(app, "customers")) == {topic}
    assert app.config.table_stream_topic("customers") == "orders"


def test_a_partitioned_table_is_a_store_asset_its_worker_runs_materialize_and_check(
    kafka_bootstrap, unique_name, tmp_path
):
    """Orders keyed by customer enriched with their customer's region from a partitioned table (left
    join), totalled per customer: the table's store records where the run's commit applied it in
    each partition, and its check passes; every order is counted. The worker job records each table
    partition its run changed, and the check."""
    source, customers = unique_name("orders"), unique_name("customers")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, {"cleanup.policy": "compact"})
    regions = {f"c{c}": f"r{c % REGIONS}" for c in range(40)}
    produce(kafka_bootstrap, customers, [(c.encode(), orjson.dumps({"region": r})) for c, r in regions.items()])
    produce(kafka_bootstrap, source, [(key, value) for key, value in orders() if int(key[1:]) % 2 == 0])
    app = App(
        name=unique_name("enriched"), source=source, stores=["totals"], consumer_config=FAST_GROUP, **FAST_COMMITS
    )
    profiles = app.table(customers, name="profiles")
    app.dataframe().join(profiles, how="left", on_merge="keep-right").aggregate(Sum("amount"), name="total")
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"))
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store)
    table_key = AssetKey([app.name.replace("-", "_"), "profiles_table"])

    result = materialize(
        [defs.get_assets_def(store_key(app, "totals"))],
        resources={"kafka": kafka, "state_store": state_store},
        instance=(instance := DagsterInstance.ephemeral()),
        tags={"dagster/asset_partition_range_start": "0", "dagster/asset_partition_range_end": str(PARTITIONS - 1)},
    )

    recorded = {m.asset_key: m.metadata for m in result.asset_materializations_for_node(job_name(app, "stores"))}
    partitions = orjson.loads(orjson.dumps(recorded[table_key]["table_partitions"].value))  # as a user reads it
    assert [p["partition"] for p in partitions] == list(range(PARTITIONS))
    assert all(p["committed_position"] == p["topic_end"] and p["position_valid"] for p in partitions), partitions
    assert recorded[table_key]["table_records_applied"].value == len(regions)
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.asset_key == table_key]
    assert evaluation.passed
    assert deps_of(defs, table_key) == {AssetKey(["kafka", customers])}
    expected: dict[str, int] = {}
    for key, value in orders():
        if int(key[1:]) % 2 == 0:
            expected[key.decode()] = expected.get(key.decode(), 0) + orjson.loads(value)["amount"]
    with state_store.bind(app, kafka).read_state("totals") as reader:
        assert {entry.message_key: entry.value for entry in reader.items()} == expected

    produce(kafka_bootstrap, source, [(key, value) for key, value in orders() if int(key[1:]) % 2 == 1])
    job = defs.resolve_job_def(job_name(app, "worker")).execute_in_process(
        instance=instance, run_config={"ops": {job_name(app, "run_worker_op"): {"config": {"max_seconds": 120}}}}
    )
    events = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in job.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    assert sorted(str(m.partition) for m in events if m.asset_key == table_key) == [str(p) for p in range(PARTITIONS)]
    checked = [e for e in job.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert any(e.event_specific_data.asset_key == table_key and e.event_specific_data.passed for e in checked)  # type: ignore[union-attr]
