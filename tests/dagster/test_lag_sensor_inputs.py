"""The lag sensor on every input of an app, against the real broker: records waiting in a re-keying
app's repartition topic are work that requests a worker run, as the source's are; a partitioned
table's records not applied by the group's last commit are reported per table and partition (and
request no run by themselves); a global table's size is reported on its topic's asset."""

from __future__ import annotations

import time

import orjson
import pytest
from dagster import AssetKey, DagsterInstance, build_sensor_context
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce

from dagster_stateful.automation.lag_observations import TABLE_LAG_TAG
from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App, Sum
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.naming import job_name, source_key, store_key, table_store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource

PARTITIONS = 3
REGIONS = 5
CUSTOMERS = 40
THRESHOLD = 100
MURMUR2 = "murmur2_random"
"""The partitioner the workers produce with: records written here land where a worker's would."""


def orders(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """Orders keyed by customer, each with its region and an amount."""
    return [
        (f"c{i % CUSTOMERS}".encode(), orjson.dumps({"region": f"r{i % REGIONS}", "amount": 1 + i % 4}))
        for i in range(start, start + count)
    ]


def totals_per_region(records: list[tuple[bytes, bytes]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for _, value in records:
        order = orjson.loads(value)
        totals[order["region"]] = totals.get(order["region"], 0) + order["amount"]
    return totals


def per_partition(records: list[tuple[bytes, bytes]]) -> dict[int, int]:
    """Records per partition of a topic of `PARTITIONS` partitions, murmur2-partitioned by key."""
    counts = dict.fromkeys(range(PARTITIONS), 0)
    for key, _ in records:
        counts[partition_of(key, PARTITIONS)] += 1
    return counts


def tick(defs, app: App, resources, instance, cursor: str | None = None):
    with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        return defs.resolve_sensor_def(job_name(app, "lag_sensor"))(context)


def deploy(kafka_bootstrap: str, app: App, tmp_path):
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"))
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, lag_threshold=THRESHOLD)
    return defs, state_store.bind(app, kafka), {"kafka": kafka, "state_store": state_store}


@pytest.fixture
def regions(kafka_bootstrap, unique_name, tmp_path):
    """A re-keying app (orders re-keyed by region, totalled per region), its backlog processed."""
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce(kafka_bootstrap, source, orders(300), partitioner=MURMUR2)
    app = App(name=unique_name("regions"), source=source, stores=["totals"], consumer_config=FAST_GROUP, **FAST_COMMITS)
    app.dataframe().group_by("region").aggregate(Sum("amount"), name="total")
    defs, bound, resources = deploy(kafka_bootstrap, app, tmp_path)
    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    return defs, app, bound, resources


def test_records_waiting_in_the_repartition_topic_request_a_worker_run(regions, kafka_bootstrap):
    """Records the re-keying wrote to the repartition topic and no worker consumed yet (written here
    as the re-keying writes them: keyed by the new key, murmur2-partitioned) pass the threshold with
    the source caught up; the run they ask for processes them. A cursor of an older release (the
    source's window alone, samples without the low watermark) still loads."""
    defs, app, bound, resources = regions
    repartition = app.config.repartition_topic
    assert repartition is not None
    waiting = [
        (f"r{i % REGIONS}".encode(), orjson.dumps({"region": f"r{i % REGIONS}", "amount": 2})) for i in range(150)
    ]
    produce(kafka_bootstrap, repartition, waiting, partitioner=MURMUR2)
    instance = DagsterInstance.ephemeral()
    old_cursor = orjson.dumps({"window": {"version": 1, "partitions": {"0": [[time.time() - 60, 0, 100]]}}}).decode()

    requested = tick(defs, app, resources, instance, cursor=old_cursor)

    assert len(requested.run_requests) == 1, requested.skip_reason
    assert requested.run_requests[0].tags["dagster-stateful/lag"] == "150"
    repartition_key = AssetKey([app.name.replace("-", "_"), "region_repartition"])
    totals = {e.asset_key: e.metadata["total_lag"].value for e in requested.asset_events if e.partition is None}
    assert totals == {source_key(app): 0, repartition_key: 150}
    observed = {
        int(e.partition): e.metadata["lag"].value
        for e in requested.asset_events
        if e.asset_key == store_key(app, "totals")
    }
    expected = per_partition(waiting)
    assert observed == expected, "the state's partitions are the repartition topic's"
    cursor = orjson.loads(requested.cursor)
    assert set(cursor) == {"window", f"window:{repartition}"}
    assert len(cursor["window"]["partitions"]["0"]) == 2, "the old cursor's sample was kept beside the new one"

    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    with bound.read_state("totals") as reader:
        stored = {entry.message_key: entry.value for entry in reader.items()}
    assert stored == totals_per_region(orders(300) + waiting)
    done = tick(defs, app, resources, instance, cursor=requested.cursor)
    assert not done.run_requests and "total lag 0" in done.skip_reason.skip_message


@pytest.fixture
def enriched(kafka_bootstrap, unique_name, tmp_path):
    """Orders keyed by customer, joined with a global table of regions and a partitioned table of
    customer profiles, totalled per customer; its backlog processed (every table record applied)."""
    source, customers, zones = unique_name("orders"), unique_name("customers"), unique_name("zones")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, {"cleanup.policy": "compact"})
    create_topic(kafka_bootstrap, zones, 1, {"cleanup.policy": "compact"})
    produce(kafka_bootstrap, zones, [(f"r{r}".encode(), orjson.dumps({"zone": f"z{r % 2}"})) for r in range(REGIONS)])
    profiles = [(f"c{c}".encode(), orjson.dumps({"segment": "new"})) for c in range(CUSTOMERS)]
    produce(kafka_bootstrap, customers, profiles, partitioner=MURMUR2)
    produce(kafka_bootstrap, source, orders(200), partitioner=MURMUR2)
    app = App(
        name=unique_name("enriched"), source=source, stores=["totals"], consumer_config=FAST_GROUP, **FAST_COMMITS
    )
    regions = app.global_table(zones, name="regions")
    table = app.table(customers, name="profiles")
    steps = app.dataframe().join(regions, on="region", how="left", on_merge="keep-left")
    steps.join(table, how="left", on_merge="keep-right").aggregate(Sum("amount"), name="total")
    defs, bound, resources = deploy(kafka_bootstrap, app, tmp_path)
    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    assert [d.records_not_applied for d in bound.describe_tables()] == [0] * PARTITIONS
    return defs, app, bound, resources


def table_lag(result, app: App) -> dict[int, int]:
    key = table_store_key(app, "profiles")
    return {
        int(e.partition): e.metadata["records_not_applied"].value for e in result.asset_events if e.asset_key == key
    }


def test_a_tables_records_not_applied_show_per_partition_and_request_no_run_alone(enriched, kafka_bootstrap):
    """Profile updates after the last commit are the table's lag, per partition, on the table's
    asset; with no stream record waiting they request no run (a run would apply none). Orders past
    the threshold request one, tagged with the table's lag, and its run applies the updates. The
    global table's topic shows the most a worker's start reads."""
    defs, app, bound, resources = enriched
    customers = app.config.tables["profiles"]
    updates = [(f"c{c}".encode(), orjson.dumps({"segment": "loyal"})) for c in range(0, CUSTOMERS, 3)]
    produce(kafka_bootstrap, customers, updates, partitioner=MURMUR2)
    expected = per_partition(updates)
    instance = DagsterInstance.ephemeral()

    quiet = tick(defs, app, resources, instance)

    assert not quiet.run_requests
    message = quiet.skip_reason.skip_message
    assert "total lag 0" in message and f"profiles {len(updates)}" in message, message
    assert table_lag(quiet, app) == expected
    [zones] = [e for e in quiet.asset_events if e.metadata.get("global_table") is not None]
    assert zones.asset_key == AssetKey(["kafka", app.config.global_tables["regions"]])
    assert zones.metadata["records_read_at_start_at_most"].value == REGIONS
    assert zones.metadata["end_offsets"].value == {"0": REGIONS}

    produce(kafka_bootstrap, app.source, orders(150, start=200), partitioner=MURMUR2)
    requested = tick(defs, app, resources, instance, cursor=quiet.cursor)

    assert len(requested.run_requests) == 1
    assert requested.run_requests[0].tags[TABLE_LAG_TAG] == f"profiles={len(updates)}"
    assert requested.run_requests[0].tags["dagster-stateful/lag"] == "150"
    assert {partition_of(key, PARTITIONS) for key, _ in orders(150, start=200)} == set(range(PARTITIONS))
    assert bound.run_worker(max_seconds=120).stop_reason == "caught_up"
    done = tick(defs, app, resources, instance, cursor=requested.cursor)
    assert not done.run_requests
    assert table_lag(done, app) == dict.fromkeys(range(PARTITIONS), 0), "orders after the updates applied them"
