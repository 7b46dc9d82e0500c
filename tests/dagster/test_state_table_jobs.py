"""The bootstrap-state and transform-state jobs, as the Dagster UI launches them, against the real
broker: both refuse without `confirm: true`; with it, a Parquet table becomes the store's state at
the source positions given, the example's migration renames a state key, and each records the
snapshot it published. A changelog replay elsewhere gives the state each job made."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from faults.counting_worker import COMPACT_FAST
from support.core_helpers import FAST_COMMITS, FAST_GROUP, store_content
from support.kafka_helpers import create_topic, produce

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.resources import KafkaResource, StateStoreResource
from example.apps import add_to_total

PARTITIONS = 3
ORDERS = [(f"c{i % 7}".encode(), orjson.dumps({"customer": f"c{i % 7}", "amount": 10 + i % 5})) for i in range(120)]


def state_of(customers: dict[str, tuple[float, int]]) -> pa.Table:
    rows = [(c, "total", float(t)) for c, (t, _) in customers.items()] + [
        (c, "orders", float(n)) for c, (_, n) in customers.items()
    ]
    return pa.table({"key": [r[0] for r in rows], "state_key": [r[1] for r in rows], "value": [r[2] for r in rows]})


def folded(orders: list[tuple[bytes, bytes]]) -> dict[str, tuple[float, int]]:
    totals: dict[str, tuple[float, int]] = {}
    for _, value in orders:
        order = orjson.loads(value)
        total, count = totals.get(order["customer"], (0.0, 0))
        totals[order["customer"]] = (round(total + order["amount"], 2), count + 1)
    return totals


@pytest.fixture
def deployment(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    produce(kafka_bootstrap, source, ORDERS)
    app = App(
        name=unique_name("totals"),
        source=source,
        stores=["totals"],
        changelog_config=COMPACT_FAST,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    app.dataframe().apply(add_to_total, stateful=True)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store)
    return defs, app, state_store.bind(app, kafka), tmp_path


def launch(defs, app, purpose: str, config: dict):
    job = defs.resolve_job_def(job_name(app, purpose))
    ops = {job_name(app, f"{purpose}_op"): {"config": config}}
    with DagsterInstance.ephemeral() as instance:
        return job.execute_in_process(run_config={"ops": ops}, instance=instance, raise_on_error=False)


def changelog_replay(app: App, where) -> dict[tuple[str, str], float]:
    elsewhere = app.bind(state_dir=where)
    elsewhere.restore_partitions(range(PARTITIONS), from_scratch=True, method="changelog")
    content = store_content(elsewhere, "totals", PARTITIONS)
    return {(key.decode(), state_key.decode()): orjson.loads(value) for (key, state_key), value in content.items()}


def test_bootstrap_and_transform_jobs_refuse_without_confirm_and_rewrite_the_state_with_it(deployment):
    defs, app, bound, tmp_path = deployment
    pq.write_table(state_of(folded(ORDERS[:80])), tmp_path / "totals.parquet")
    positions = {str(p): high for p, (_, high) in bound.kafka.watermarks(app.source, range(PARTITIONS)).items()}
    bootstrap = {"store": "totals", "table_path": str(tmp_path / "totals.parquet"), "source_offsets": positions}
    transform = {"store": "totals", "transformation": "example.migrations:orders_as_order_count", "engine": "pandas"}

    for purpose, config in (("bootstrap_state", bootstrap), ("transform_state", transform)):
        refused = launch(defs, app, purpose, config)
        assert not refused.success
        assert "set `confirm: true`" in str(refused.failure_data_for_node(job_name(app, f"{purpose}_op")).error)

    booted = launch(defs, app, "bootstrap_state", {**bootstrap, "confirm": True})
    assert booted.success
    expected = {(c, "total"): t for c, (t, _) in folded(ORDERS[:80]).items()}
    expected |= {(c, "orders"): float(n) for c, (_, n) in folded(ORDERS[:80]).items()}
    assert changelog_replay(bound, tmp_path / "after-bootstrap") == expected
    migrated = launch(defs, app, "transform_state", {**transform, "confirm": True})
    assert migrated.success
    renamed = {(c, "order_count" if k == "orders" else k): v for (c, k), v in expected.items()}
    assert changelog_replay(bound, tmp_path / "after-migration") == renamed
    for result, rows in ((booted, len(expected)), (migrated, len(renamed))):
        [snapshot] = [
            m for m in result.get_asset_materialization_events() if m.asset_key == snapshot_key(app, "totals")
        ]
        assert snapshot.materialization.metadata["dagster/row_count"].value == rows
