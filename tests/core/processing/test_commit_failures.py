"""A delivery failure is sticky for the run: no later commit may commit anything (real broker).

A record Kafka rejected (an output, or a changelog record) is lost for good. If a later commit, or
the commit at close, went through, the source offsets would move past the messages whose records
were lost. So once a delivery failed, every commit raises `DeliveryError` again, writes no source
offset and no RocksDB batch, and the committer says it failed so the worker can close dirty.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.kafka_helpers import create_topic, produce

from dagster_stateful.core import AppConfig, JsonSerde
from dagster_stateful.core.processing.commit.committer import Committer
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import DeliveryError

TOPIC_MAX_BYTES = 1024
TOO_LARGE = "x" * (4 * TOPIC_MAX_BYTES)


@dataclass
class CommitSetup:
    config: AppConfig
    output: str
    committer: Committer
    producer: Producer
    store: StorePartition
    txn: PartitionTransaction


@pytest.fixture
def setup(kafka_bootstrap: str, unique_name, tmp_path: Path) -> Iterator[CommitSetup]:
    """An app whose changelog and output topics refuse records over 1 KiB, with the worker's
    producer settings, a committer on a consumer of its group, and partition 0's transaction."""
    config = AppConfig(name=unique_name("totals"), source=unique_name("orders"), stores=("totals",))
    output = unique_name("out")
    create_topic(kafka_bootstrap, config.source)
    produce(kafka_bootstrap, config.source, [(b"a", b"{}"), (b"a", b"{}")])
    small = {"max.message.bytes": str(TOPIC_MAX_BYTES)}
    create_topic(kafka_bootstrap, config.changelog_topic("totals"), config={"cleanup.policy": "compact", **small})
    create_topic(kafka_bootstrap, output, config=small)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": config.consumer_group})
    consumer.assign([TopicPartition(config.source, 0)])
    tracker = DeliveryTracker()
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "on_delivery": tracker,
        }
    )
    committer = Committer(consumer, producer, tracker, config.source, config.changelog_topics())
    store = StateDirectory(tmp_path, config).partition("totals", 0)
    store.open()
    try:
        yield CommitSetup(
            config,
            output,
            committer,
            producer,
            store,
            PartitionTransaction(0, {"totals": store}, JsonSerde(), committed_offset=None),
        )
    finally:
        store.close()
        producer.flush(10)
        consumer.close()


def process(txn: PartitionTransaction, offset: int, total: object) -> None:
    """What the worker does for a message of key 'a' whose step sets its total."""
    txn.begin_message(b"a", offset)
    txn.states["totals"].set("total", total)
    txn.accept_message(offset)


def committed_source_offset(bootstrap: str, config: AppConfig) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": config.consumer_group})
    try:
        [position] = reader.committed([TopicPartition(config.source, 0)], timeout=30)
        return position.offset
    finally:
        reader.close()


def assert_nothing_committed(bootstrap: str, setup: CommitSetup) -> None:
    assert committed_source_offset(bootstrap, setup.config) < 0, "the group has no committed offset"
    assert setup.store.get(message_prefix(b"a") + b"total") is None, "RocksDB holds nothing of it"
    assert setup.store.source_offset is None and setup.store.read_checkpoint() is None


def test_after_an_output_record_was_rejected_no_commit_goes_through(kafka_bootstrap, setup):
    process(setup.txn, 0, 5)
    setup.producer.produce(setup.output, key=b"a", value=TOO_LARGE.encode())  # the worker's output produce

    with pytest.raises(DeliveryError, match=setup.output) as first:
        setup.committer.commit([setup.txn])

    process(setup.txn, 1, 6)  # the run goes on (or closes): its records are all deliverable
    with pytest.raises(DeliveryError, match="earlier"):
        setup.committer.commit([setup.txn])

    assert setup.committer.failed and setup.committer.failure is first.value
    assert_nothing_committed(kafka_bootstrap, setup)


def test_after_a_changelog_record_was_rejected_no_commit_goes_through(kafka_bootstrap, setup):
    changelog = setup.config.changelog_topic("totals")
    process(setup.txn, 0, TOO_LARGE)

    with pytest.raises(DeliveryError, match=changelog):
        setup.committer.commit([setup.txn])

    process(setup.txn, 1, 6)  # overwrites the key in the write cache: the next commit's records are small
    with pytest.raises(DeliveryError):
        setup.committer.commit([setup.txn])
    assert setup.committer.failed
    assert_nothing_committed(kafka_bootstrap, setup)
