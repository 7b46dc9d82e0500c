"""Where a restored partition starts processing when librdkafka has not started fetching it yet.

A partition is assigned paused; once its stores are up to date the worker resumes it and seeks it
to its starting offset, which starts the fetch at once. Right after an assignment, librdkafka may
not have started the partition's fetch yet and refuses the seek (`_STATE`). That is harmless for a
partition without a committed offset (it was assigned at the position `auto.offset.reset` names,
where librdkafka starts it anyway), and must stay an error for one that has to start at a
committed or rewound offset. The refusal is produced by a consumer whose `seek` answers as
librdkafka does in that state; Kafka itself is not involved.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.processing.restores.state_updater import RestoringPartition
from dagster_stateful.core.processing.worker.rebalance import PartitionAssignments
from dagster_stateful.core.state.directory import StateDirectory

CONFIG = AppConfig(name="totals", source="orders", stores=("totals",))
UNREACHABLE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}


class FetchNotStarted(Consumer):
    """A consumer whose partitions' fetches have not started: it refuses seeks as librdkafka does."""

    def __init__(self) -> None:
        super().__init__({**UNREACHABLE, "group.id": "activation-test"})
        self.resumed: list[int] = []

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed.extend(tp.partition for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, f"Failed to seek to offset {partition.offset}"))


@pytest.fixture
def assignments(tmp_path):
    kafka = KafkaClients(UNREACHABLE)
    return PartitionAssignments(
        CONFIG,
        kafka,
        StateDirectory(tmp_path, CONFIG),
        Listeners(),
        None,
        WorkerReport(CONFIG.name),
        lambda: None,
        offset_reader=None,  # type: ignore[arg-type]  # never read here
    )


def test_a_partition_without_a_committed_offset_resumes_where_librdkafka_starts_it(assignments):
    consumer = FetchNotStarted()
    try:
        assignments.activate(consumer, RestoringPartition(3, committed=None, assigned_at=0.0))
        assert consumer.resumed == [3]
        assert 3 in assignments.transactions
    finally:
        consumer.close()


@pytest.mark.parametrize(("committed", "rewind_to"), [(42, None), (42, 40), (None, 7)])
def test_a_partition_that_must_start_at_an_offset_fails_when_the_seek_is_refused(assignments, committed, rewind_to):
    consumer = FetchNotStarted()
    restored = RestoringPartition(3, committed=committed, assigned_at=0.0)
    restored.rewind_to = rewind_to
    try:
        with pytest.raises(KafkaException, match="Failed to seek to offset"):
            assignments.activate(consumer, restored)
    finally:
        consumer.close()
