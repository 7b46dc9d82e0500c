"""Migrating a store's state between versions of an app, with Spark, against the real broker.

Version 1 keeps `{"total": x}` per customer; the migration reshapes the latest snapshot's rows to
version 2's `{"amount": {"sum": x}}`. A restore from the migrated snapshot and one from the
changelog alone must both give the migrated expectation (recomputed from the source topic), and
version 2 then keeps processing from where version 1 stopped, on the same state directory, with
the changelog compacted aggressively.
"""

from __future__ import annotations

import os
import random

import orjson
import pytest
from faults.counting_worker import COMPACT_FAST
from pyspark.sql import functions as F
from support.core_helpers import FAST_COMMITS, FAST_GROUP, store_content
from support.kafka_helpers import create_topic, produce, read_messages

from dagster_stateful.core import App, State
from dagster_stateful.core.config import ProcessingGuarantee
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.errors import StateTableError
from dagster_stateful.spark.snapshots import snapshot_changelog
from dagster_stateful.state_table import transform_state

pytestmark = pytest.mark.spark
PARTITIONS, CUSTOMERS = 3, 25
SEED = int(os.environ.get("FAULT_SEED") or random.randrange(2**32))
"""The orders' seed: every failure message names it, and FAULT_SEED=<seed> replays it."""


def add_v1(order: dict, state: State) -> None:
    state.set("summary", {"total": state.get("summary", {"total": 0})["total"] + order["amount"]})


def add_v2(order: dict, state: State) -> None:
    summary = state.get("summary", {"amount": {"sum": 0}})
    state.set("summary", {"amount": {"sum": summary["amount"]["sum"] + order["amount"]}})


def to_v2(rows):
    """The migration, a DataFrame transformation: version 1's `total` column becomes `amount.sum`."""
    return rows.select("partition", "key", "state_key", F.struct(F.col("total").alias("sum")).alias("amount"))


def app_version(step, bootstrap: str, source: str, name: str, state_dir, snapshots: str, guarantee) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        snapshot_root=snapshots,
        processing_guarantee=guarantee,
        changelog_config=COMPACT_FAST,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    app.dataframe().update(step, stateful=True)
    return app


def orders(rng: random.Random, start: int, count: int) -> list[tuple[bytes, bytes]]:
    made = []
    for i in range(start, start + count):
        customer = f"c{rng.randrange(CUSTOMERS)}"
        made.append((customer.encode(), orjson.dumps({"id": i, "customer": customer, "amount": rng.randint(1, 90)})))
    return made


def recomputed_v2(bootstrap: str, source: str) -> dict[str, dict]:
    sums: dict[str, int] = {}
    for message in read_messages(bootstrap, source):
        order = orjson.loads(message.value())
        sums[order["customer"]] = sums.get(order["customer"], 0) + order["amount"]
    return {customer: {"amount": {"sum": total}} for customer, total in sums.items()}


def summaries(app: App) -> dict[str, dict]:
    content = store_content(app, "totals", PARTITIONS)
    return {key.decode(): orjson.loads(value) for (key, state_key), value in content.items() if state_key == b"summary"}


def test_a_migrated_store_restores_the_new_shape_from_snapshot_or_changelog_and_version_2_processes_on(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    guarantee = ProcessingGuarantee.AT_LEAST_ONCE  # the migration's records are committed state under both
    rng, replay = random.Random(SEED), f"FAULT_SEED={SEED}"
    source, name, snapshots = unique_name("orders"), unique_name("totals"), str(tmp_path / "snapshots")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    produce(kafka_bootstrap, source, orders(rng, 0, 800))
    v1 = app_version(add_v1, kafka_bootstrap, source, name, tmp_path / "state", snapshots, guarantee)
    v2 = app_version(add_v2, kafka_bootstrap, source, name, tmp_path / "state", snapshots, guarantee)
    assert v1.run_worker(max_seconds=120).total_processed == 800, replay
    store = SnapshotStore(snapshots, name, "totals")
    options = {"kafka.bootstrap.servers": kafka_bootstrap}
    snapshot_changelog(spark, v1.kafka, options, name, source, v1.changelog_topic("totals"), store)

    report = transform_state(v2, "totals", to_v2, spark=spark)

    migrated = recomputed_v2(kafka_bootstrap, source)
    assert report.changed == report.rows == len(migrated) and report.tombstones == 0, f"{replay}: {report}"
    for method in ("snapshot", "changelog"):
        elsewhere = v2.bind(state_dir=tmp_path / f"restored-{method}")
        elsewhere.restore_partitions(range(PARTITIONS), from_scratch=True, method=method)
        assert summaries(elsewhere) == migrated, f"{replay}: restored by {method}"
    produce(kafka_bootstrap, source, orders(rng, 800, 400))
    assert v2.run_worker(max_seconds=120).total_processed == 400, f"{replay}: version 2 goes on from the commit"
    assert summaries(v2) == recomputed_v2(kafka_bootstrap, source), f"{replay}: {guarantee.value}"
    with pytest.raises(StateTableError, match="does not reach the end of changelog"):
        transform_state(v2, "totals", lambda rows: rows, spark=spark)
