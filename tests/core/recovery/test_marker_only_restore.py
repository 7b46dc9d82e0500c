"""A partial restore whose range holds no record (under exactly-once, the commit's transaction marker
sits where the store's changelog offset points) ends as soon as the consumer's position reaches
the end, instead of waiting out the batch's wait for records that never come. No broker: a
consumer that, like a real one over such a range, returns nothing and moves its position past the
marker on its first fetch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from support.core_helpers import opened_partition

from dagster_stateful.core import AppConfig
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog_replay import BATCH_WAIT, BATCH_WAIT_SLICE, ChangelogRestore
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition

MARKER = 41
"""The offset of the transaction marker the restore's range holds, and nothing else."""


class MarkerOnlyConsumer:
    """An assign-only consumer over a changelog whose offsets [MARKER, MARKER + 1) hold a marker."""

    def __init__(self, fetched_after_calls: int) -> None:
        self.timeouts: list[float] = []
        self._fetched_after = fetched_after_calls

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.partition = partitions[0]

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list:
        self.timeouts.append(timeout)
        return []

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        fetched = len(self.timeouts) >= self._fetched_after
        offset = MARKER + 1 if fetched else MARKER
        return [TopicPartition(partitions[0].topic, partitions[0].partition, offset)]


@pytest.fixture
def store(tmp_path) -> Iterator[StorePartition]:
    config = AppConfig(name="app", source="orders", stores=("totals",), processing_guarantee="exactly-once")  # type: ignore[arg-type]
    for part in opened_partition(StateDirectory(tmp_path, config), "totals"):
        part.commit([(b"key", b"1")], MARKER, 10)  # the commit's records end where its marker sits
        yield part


@pytest.mark.parametrize("fetched_after_calls", [1, 3])
def test_a_restore_of_a_range_without_records_ends_once_the_position_passes_it(store, fetched_after_calls):
    consumer = MarkerOnlyConsumer(fetched_after_calls)
    restore = ChangelogRestore(consumer, Listeners(), store, 10, start=MARKER, end=MARKER + 1, batch_size=100)  # type: ignore[arg-type]

    applied = restore.step()

    assert applied == 0 and restore.done
    assert len(consumer.timeouts) == fetched_after_calls, "it asked no more once the position reached the end"
    assert sum(consumer.timeouts) <= fetched_after_calls * BATCH_WAIT_SLICE < BATCH_WAIT
    report = restore.finish()
    assert report.records_applied == 0 and store.changelog_offset == MARKER + 1
