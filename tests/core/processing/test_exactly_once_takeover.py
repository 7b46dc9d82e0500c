"""Exactly-once: a worker taking over partitions whose previous owner died inside a commit.

The dead owner sent its offsets to its transaction (`send_offsets_to_transaction`) and died before
committing it, so the group's offsets of those partitions are unstable for `read_committed`
readers until the broker aborts the transaction, `transaction.timeout.ms` (and its clean-up
interval) later. The new owner must wait that long, not give up, and then process from the
committed offsets: every order once in its outputs, nothing of the dead transaction visible. The
transaction timeout here is 50 s, past the 45 s that reading offsets used to allow."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from support.core_helpers import (
    add_to_total,
    expected_totals,
    make_orders,
    orders_topic,
    outputs_per_customer,
    running_sums,
)
from support.kafka_helpers import create_topic, produce
from test_exactly_once import exactly_once_app

from dagster_stateful.core import App

TRANSACTION_TIMEOUT_MS = 50_000
PARTITIONS = 2


def leave_offsets_in_an_open_transaction(bootstrap: str, app: App, offsets: dict[int, int]) -> Producer:
    """What a worker killed between sending its offsets and committing leaves behind."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{app.name}-eos-dead-worker",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        }
    )
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(app.config.output or "", key=b"c0", value=b'{"customer": "c0", "total": -1}')
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": app.consumer_group})
    try:
        topic_partitions = [TopicPartition(app.source, p, offset) for p, offset in offsets.items()]
        producer.send_offsets_to_transaction(topic_partitions, member.consumer_group_metadata())
    finally:
        member.close()
    return producer  # kept, never committed: the broker aborts it when it times out


def test_a_new_owner_waits_out_the_dead_owners_open_transaction_then_processes_each_order_once(
    kafka_bootstrap, unique_name, tmp_path
):
    orders = make_orders(400, customers=20)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, orders[:200])
    output = unique_name("totals-out")
    create_topic(kafka_bootstrap, output, PARTITIONS)
    app = exactly_once_app(kafka_bootstrap, source, output, tmp_path / "first", unique_name("eos"), add_to_total)
    app.config = app.config.replace(producer_config={"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS})
    first = app.run_worker(max_seconds=120)
    assert first.total_processed == 200
    dangling = leave_offsets_in_an_open_transaction(kafka_bootstrap, app, dict.fromkeys(range(PARTITIONS), 0))
    produce(kafka_bootstrap, source, orders[200:])

    second = app.bind(state_dir=tmp_path / "second").run_worker(max_seconds=150)

    assert second.stop_reason == "caught_up" and second.total_processed == 200, "from the committed offsets"
    assert outputs_per_customer(kafka_bootstrap, output) == running_sums(kafka_bootstrap, source)
    assert expected_totals(orders) == {c: sums[-1] for c, sums in running_sums(kafka_bootstrap, source).items()}
    del dangling
