"""Failures that are never the message's fault: a damaged store met while processing, and a send that
Kafka refuses. Neither may skip, dead-letter or commit anything it should not."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import create_topic, produce, read_all
from support.state_damage import damage_data_block

from dagster_stateful.core import DeliveryError, State
from dagster_stateful.core.state.checkpoint import read_checkpoint


@pytest.mark.parametrize("on_error", ["raise", "skip", "dead-letter"])
def test_a_damaged_store_met_in_a_step_is_restored_and_no_message_is_blamed(
    kafka_bootstrap, unique_name, tmp_path, on_error
):
    first, later = make_orders(4000, customers=2000), make_orders(2000, customers=2000, start=4000)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, first)
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name, on_error=on_error)
    app.run_worker(max_seconds=120)
    part = app.state.partition("totals", 0)
    part.open()
    part.db.flush()  # the committed state in SST files, where a failing disk damages it
    part.close()
    damage_data_block(app.state.partition_path("totals", 0))
    produce(kafka_bootstrap, source, later)

    report = app.run_worker(max_seconds=120)

    assert report.stores_recovered >= 1, "the damaged block was read and the store restored"
    assert report.skipped == 0 and report.dead_lettered == 0, "no message was blamed for the damage"
    assert report.stop_reason == "caught_up" and report.committed_offsets == {0: 6000}
    assert totals_in_store(app, 1) == expected_totals(first + later)
    assert list(app.state.corrupt_copies("totals", 0)), "the damaged copy is kept for inspection"


def big_for_c3(order: dict, state: State) -> dict:
    total = state.get("total", 0) + order["amount"]
    state.set("total", total)
    padding = "x" * 4096 if order["customer"] == "c3" else ""
    return {"customer": order["customer"], "total": total, "padding": padding}


def test_after_a_refused_send_the_worker_closes_without_committing(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(60, customers=6)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, orders)
    output = unique_name("totals-out")
    create_topic(kafka_bootstrap, output, partitions=1, config={"max.message.bytes": "1024"})
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name, step=big_for_c3, output=output)
    app.to_topic(app.dataframe())

    with pytest.raises(DeliveryError):
        app.run_worker(max_seconds=60)

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    committed = app.kafka.committed_offsets(name, source, [0])
    assert committed == {0: None}, "nothing was committed after the refused send, not even on close"
    checkpoint = read_checkpoint(app.state.partition_path("totals", 0))
    assert checkpoint is None or checkpoint.source_offset is None

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        output,
        incremental_configs=[ConfigEntry("max.message.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    report = app.run_worker(max_seconds=120)

    assert report.committed_offsets == {0: len(orders)}
    assert totals_in_store(app, 1) == expected_totals(orders)
    outputs = [orjson.loads(value) for _, value in read_all(kafka_bootstrap, output) if value is not None]
    assert sorted(o["total"] for o in outputs if o["customer"] == "c3") == sorted(
        sum(orjson.loads(v)["amount"] for k, v in orders[: i + 1] if k == b"c3")
        for i, (k, _) in enumerate(orders)
        if k == b"c3"
    ), "every output of the failed run was sent again"
