"""An at-least-once commit records where its stores' changelogs end when every record below is of a
committed message, and only then (real broker).

The worker knows that of a changelog partition when its restore read it (`ChangelogPrefix`) and
the partition grew since by exactly the records its own commits produced. A record from anyone else
(a worker that lost the partition and does not know it yet) stops the recording until the next
restore; uncommitted records the restore read delay it until the commits pass them. Both ways of
learning where a partition ends are covered: delivery reports, and asking the broker when the
producer reports errors only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.kafka_helpers import create_topic, produce, read_messages

from dagster_stateful.core import AppConfig, JsonSerde
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.processing.commit.committer import Committer
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.recovery.changelog_format import block_headers
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.core.state.commit_metadata import CommitMetadata, decode_commit_metadata
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction


@dataclass
class Setup:
    bootstrap: str
    config: AppConfig
    committer: Committer
    store: StorePartition
    txn: PartitionTransaction

    def process(self, offset: int, key: bytes = b"a") -> None:
        """What the worker does for a message whose step adds to its key's total."""
        self.txn.begin_message(key, offset)
        state = self.txn.states["totals"]
        state.set("total", (state.get("total") or 0) + 1)
        self.txn.accept_message(offset)

    def committed(self) -> CommitMetadata:
        [(offset, metadata)] = self.kafka.committed(self.config.consumer_group, self.config.source, [0]).values()
        return decode_commit_metadata(metadata, offset, "test")

    def changelog_end(self) -> int:
        return self.kafka.watermarks(self.config.changelog_topic("totals"), [0])[0][1]

    def changelog_headers(self) -> list[list[tuple[str, bytes]] | None]:
        """The headers of each record of the changelog, in order."""
        return [message.headers() for message in read_messages(self.bootstrap, self.config.changelog_topic("totals"))]

    @property
    def kafka(self) -> KafkaClients:
        return KafkaClients({"bootstrap.servers": self.bootstrap})


@pytest.fixture(params=["delivery-reports", "errors-only"])
def setup(request, kafka_bootstrap: str, unique_name, tmp_path: Path) -> Iterator[Setup]:
    config = AppConfig(name=unique_name("totals"), source=unique_name("orders"), stores=("totals",))
    create_topic(kafka_bootstrap, config.source)
    produce(kafka_bootstrap, config.source, [(b"a", b"{}")] * 20)
    create_topic(kafka_bootstrap, config.changelog_topic("totals"), config={"cleanup.policy": "compact"})
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": config.consumer_group})
    consumer.assign([TopicPartition(config.source, 0)])
    tracker = DeliveryTracker()
    settings = {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "on_delivery": tracker}
    if request.param == "errors-only":
        settings["delivery.report.only.error"] = True
    producer = Producer(settings)
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    # The commit asks where the changelog ends within 2 s; a topic created a moment ago may not have
    # a known leader yet, so the test starts once the broker answers for it.
    assert kafka.ends(config.changelog_topic("totals"), [0], 30) == {0: 0}
    committer = Committer(
        consumer, producer, tracker, config.source, config.changelog_topics(), changelog_ends=kafka.ends
    )
    store = StateDirectory(tmp_path, config).partition("totals", 0)
    store.open()
    try:
        yield Setup(
            kafka_bootstrap, config, committer, store, PartitionTransaction(0, {"totals": store}, JsonSerde(), None)
        )
    finally:
        store.close()
        producer.flush(10)
        consumer.close()


def test_each_commit_records_where_the_changelog_ends_once_a_restore_read_it(setup):
    setup.store.changelog_prefix = ChangelogPrefix(0, 0)  # as a restore of the empty changelog leaves it
    setup.process(0, b"a")
    setup.process(1, b"b")
    setup.committer.commit([setup.txn])

    assert setup.changelog_end() == 2
    assert setup.committed().changelog_ends == {"totals": 2} and setup.store.changelog_offset == 2

    setup.process(2, b"a")
    setup.committer.commit([setup.txn])
    assert setup.committed().changelog_ends == {"totals": 3} and setup.changelog_end() == 3


def test_a_record_from_another_writer_stops_the_recording_until_the_next_restore(setup, caplog):
    setup.store.changelog_prefix = ChangelogPrefix(0, 0)
    setup.process(0)
    setup.committer.commit([setup.txn])
    assert setup.committed().changelog_ends == {"totals": 1}

    produce(setup.bootstrap, setup.config.changelog_topic("totals"), [(b"zombie", b"{}")])
    setup.process(1)
    setup.committer.commit([setup.txn])

    assert setup.committed() == CommitMetadata(), "the commit went through, recording no end"
    assert setup.store.changelog_prefix is None and "not after this worker's 1 records" in caplog.text
    setup.process(2)
    setup.committer.commit([setup.txn])
    assert setup.committed() == CommitMetadata()


def test_a_commit_records_no_end_before_it_passes_the_uncommitted_records_a_restore_read(setup):
    setup.store.changelog_prefix = ChangelogPrefix(0, processed_before=5)
    setup.process(0)
    setup.committer.commit([setup.txn])
    assert setup.committed().changelog_ends == {}, "records of messages up to offset 4 may lie below the end"

    for offset in range(1, 5):
        setup.process(offset)
    setup.committer.commit([setup.txn])
    assert setup.committed().changelog_ends == {"totals": 2}, "at offset 5 every record below is committed"


def test_a_store_whose_changelog_no_restore_read_records_no_end(setup):
    setup.process(0)
    setup.committer.commit([setup.txn])

    assert setup.committed() == CommitMetadata()


def test_each_at_least_once_commit_writes_a_block_per_store_partition(setup):
    """Headers on the first record only: the offsets the commit covers and how many records it wrote,
    whether or not the commit can record its end."""
    setup.process(0, b"a")
    setup.committer.commit([setup.txn])
    setup.process(1, b"b")
    setup.process(2, b"a")
    setup.committer.commit([setup.txn])

    assert setup.changelog_headers() == [block_headers(0, 1, 1), block_headers(1, 3, 2), None]
    assert setup.committed() == CommitMetadata(), "no restore read the changelog: no end recorded"


def test_a_commit_writes_again_the_committed_values_a_restore_asked_for(setup):
    """Keys a restore skipped in a crashed commit's block: the next commit writes their committed
    values (a tombstone where there is none), except those it changes itself; then it forgets them."""
    setup.process(0, b"a")
    setup.committer.commit([setup.txn])
    setup.store.keys_to_rewrite = {message_prefix(b"a") + b"total", message_prefix(b"gone") + b"total"}
    setup.process(1, b"b")
    setup.committer.commit([setup.txn])
    setup.process(2, b"b")
    setup.committer.commit([setup.txn])

    records = [(m.key(), m.value()) for m in read_messages(setup.bootstrap, setup.config.changelog_topic("totals"))]
    a, b, gone = (message_prefix(key) + b"total" for key in (b"a", b"b", b"gone"))
    assert records == [(a, b"1"), (b, b"1"), (a, b"1"), (gone, None), (b, b"2")]
    assert setup.changelog_headers()[1:] == [block_headers(1, 2, 3), None, None, block_headers(2, 3, 1)]
    assert setup.store.keys_to_rewrite == set()
