"""A store's snapshot as a table, through Dagster and Spark against the real broker: the snapshot
asset writes the decoded table beside the snapshot and previews it in its materialization,
`read_state_table` reads it in Arrow, pandas and Spark, and the example's report asset receives
it as an input. Every figure is checked against totals recomputed from the source topic, with
the changelog compacted aggressively."""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from dagster import Definitions, TableMetadataValue, TableSchemaMetadataValue, materialize
from faults.counting_worker import COMPACT_FAST
from support.kafka_helpers import create_topic, produce, read_messages

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource
from dagster_stateful.state_table import read_state_table, snapshot_source_offsets
from example.apps import add_to_total
from example.defs.top_customers import top_customers_asset

pytestmark = pytest.mark.spark
PARTITIONS, CUSTOMERS, ORDERS = 3, 40, 900
SEED = int(os.environ.get("FAULT_SEED") or random.randrange(2**32))
"""The orders' seed: every failure message names it, and FAULT_SEED=<seed> replays it."""


def orders(seed: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    made = []
    for i in range(ORDERS):
        customer = f"customer-{rng.randrange(CUSTOMERS):03d}"
        made.append(
            (customer.encode(), orjson.dumps({"id": i, "customer": customer, "amount": rng.randint(100, 12000) / 100}))
        )
    return made


def recomputed(bootstrap: str, source: str) -> dict[str, tuple[int, float, int]]:
    """Per customer, from the source topic in offset order as `add_to_total` folds it: (partition, total, orders)."""
    totals: dict[str, tuple[int, float, int]] = {}
    for message in sorted(read_messages(bootstrap, source), key=lambda m: (m.partition(), m.offset())):
        order = orjson.loads(message.value())
        _, total, count = totals.get(order["customer"], (0, 0.0, 0))
        totals[order["customer"]] = (message.partition(), round(total + order["amount"], 2), count + 1)
    return totals


@pytest.fixture(scope="module")
def deployment(spark, kafka_bootstrap, tmp_path_factory):
    """The totals app after one worker run over the orders (shared by the module's tests, which only read)."""
    tmp_path = tmp_path_factory.mktemp("state-tables")
    suffix = uuid.uuid4().hex[:8]
    source = f"orders-state-tables-{suffix}"
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    produce(kafka_bootstrap, source, orders(SEED))
    app = App(
        name=f"totals-state-tables-{suffix}",
        source=source,
        stores=["totals"],
        kafka=kafka_bootstrap,
        commit_interval=0.2,
        changelog_config=COMPACT_FAST,
        consumer_config={"session.timeout.ms": 6000},
    )
    app.dataframe().apply(add_to_total, stateful=True)
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store, spark=pyspark)
    resources = {
        "kafka": kafka,
        "state_store": state_store,
        "spark": pyspark,
    }
    bound = state_store.bind(app, kafka)
    report = bound.run_worker(max_seconds=120)
    assert report.total_processed == ORDERS, f"FAULT_SEED={SEED}: the worker processed every order"
    return defs, bound, resources, recomputed(kafka_bootstrap, source)


def as_state(rows: list[dict]) -> dict[str, tuple[int, float, int]]:
    """{customer: (partition, total, orders)} from the table's rows."""
    by_customer: dict[str, dict] = {}
    for row in rows:
        by_customer.setdefault(row["key"], {"partition": row["partition"]})[row["state_key"]] = row["value"]
    return {key: (kept["partition"], kept["total"], int(kept["orders"])) for key, kept in by_customer.items()}


def test_the_snapshot_asset_writes_the_decoded_table_and_every_engine_reads_the_recomputed_totals(deployment, spark):
    defs, app, resources, expected = deployment

    result = materialize([defs.get_assets_def(snapshot_key(app, "totals"))], resources=resources)

    metadata = result.asset_materializations_for_node(job_name(app, "snapshots"))[0].metadata
    replay = f"FAULT_SEED={SEED}"
    assert metadata["dagster/row_count"].value == 2 * len(expected), replay
    schema, sample, location = (
        metadata[name] for name in ("dagster/column_schema", "state_table_sample", "state_table")
    )
    assert isinstance(schema, TableSchemaMetadataValue) and isinstance(sample, TableMetadataValue)
    assert [column.name for column in schema.schema.columns] == ["partition", "key", "state_key", "value"], replay
    assert len(sample.records) == 10 and all(record.data["key"] in expected for record in sample.records), replay
    files = pq.read_table(Path(str(location.value))).to_pylist()  # plain Parquet: no package needed
    assert as_state(files) == expected, f"{replay}: the Parquet beside the snapshot holds the recomputed totals"
    for engine in ("arrow", "pandas"):
        table = read_state_table(app, "totals", engine=engine)
        rows = table.to_pylist() if engine == "arrow" else table.to_dict(orient="records")
        assert as_state(rows) == expected, f"{replay}: {engine}"
    rows = [row.asDict() for row in read_state_table(app, "totals", engine="spark", spark=spark).collect()]
    assert as_state(rows) == expected, f"{replay}: spark"
    ends = {p: high for p, (_, high) in app.kafka.watermarks(app.source, range(PARTITIONS)).items()}
    assert snapshot_source_offsets(app, "totals") == ends, "the state of every order, where a bootstrap starts"


def test_the_examples_report_receives_the_snapshot_as_an_input_and_ranks_the_recomputed_totals(deployment):
    """The report runs on its own, as the UI launches it, after a snapshot run: its input comes from
    the latest snapshot through the IO manager the snapshot assets carry."""
    defs, app, resources, expected = deployment
    report = top_customers_asset(snapshot_key(app, "totals"), count=5)
    materialize([defs.get_assets_def(snapshot_key(app, "totals"))], resources=resources)
    deployed = Definitions.merge(defs, Definitions(assets=[report]))

    result = deployed.resolve_implicit_global_asset_job_def().execute_in_process(asset_selection=[report.key])

    [materialization] = [m for m in result.get_asset_materialization_events() if m.asset_key == report.key]
    metadata = materialization.materialization.metadata
    ranked = sorted(expected.items(), key=lambda item: (-item[1][1], item[0]))[:5]
    wanted = [{"customer": customer, "total": total, "orders": count} for customer, (_, total, count) in ranked]
    assert metadata["report"].value == wanted, f"FAULT_SEED={SEED}"
    assert metadata["customers"].value == len(expected)
