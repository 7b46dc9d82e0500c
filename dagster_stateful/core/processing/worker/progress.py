"""How far a worker got: messages left per partition, and offsets moved past transaction markers.

Owns `Progress`: `held_lag` (each partition this worker processes, read against the partition's
end), `group_lag` (every partition of an input, by the group's committed offsets: what a bounded
run reports, and what a worker that holds no partition waits on), `caught_up` and `pass_markers`
(a transactional producer's commit markers sit on offsets no message has: once every message
before them is processed, the committed offset moves past them, or the group would never look
caught up). A re-keying app has two inputs: its source, whose partitions `rekeying.Rekeying`
holds, and the repartition topic, whose partitions own the state; both count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from confluent_kafka import Consumer, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.lag import partition_lag
from dagster_stateful.core.processing.worker.rebalance import PartitionAssignments
from dagster_stateful.core.state.transaction import PartitionTransaction


class OtherSide(Protocol):
    """The other side of a join with a stream or a table (`worker.joined_streams`, `worker.foreign_key_joins`)."""

    def caught_up(self, transactions: Mapping[int, PartitionTransaction]) -> bool:
        """Whether every held task partition has taken in the other side up to its end."""
        ...


class Processed(Protocol):
    """A held partition's progress: the offset of the next message to process (None: none yet)."""

    next_offset: int | None


class Progress:
    def __init__(
        self,
        kafka: KafkaClients,
        consumer: Consumer,
        config: AppConfig,
        assignments: PartitionAssignments,
        pinned: bool = False,
        waiting: Callable[[int], int | None] | None = None,
        streams: OtherSide | None = None,
    ) -> None:
        """pinned: the run holds chosen partitions of the state's topic only (a re-keying app's
        source is then left to the group's runs). waiting: the offset of the first record of a task
        partition that waits for a join's grace (read, not processed), or None. streams: an interval
        join's joined stream, whose partitions held here must be processed to their ends too."""
        self._streams = streams
        self._waiting = waiting
        self._pinned = pinned
        self._kafka = kafka
        self._consumer = consumer
        self._config = config
        self._assignments = assignments

    def _held(self) -> list[tuple[str, Mapping[int, Processed]]]:
        held: list[tuple[str, Mapping[int, Processed]]] = [(self._config.task_topic, self._assignments.transactions)]
        rekeying = self._assignments.rekeying
        if rekeying is not None:
            held.append((rekeying.topic, rekeying.positions))
        return held

    def pass_markers(self) -> None:
        """Move each partition's next offset to the consumer's position when that is further.

        Only between batches, when every message consume() returned has been processed: the position
        then counts nothing unprocessed, only markers no message sits on. A run that stops at
        max_messages in the middle of a batch must not call it.
        """
        for topic, held in self._held():
            if not held:
                continue
            for topic_partition in self._consumer.position([TopicPartition(topic, p) for p in held]):
                processed = held.get(topic_partition.partition)
                if processed is not None and processed.next_offset is not None:
                    moved = topic_partition.offset
                    if self._waiting is not None and topic == self._config.task_topic:
                        first = self._waiting(topic_partition.partition)
                        moved = moved if first is None else min(moved, first)
                    processed.next_offset = max(processed.next_offset, moved)

    def held_lag(self, topic: str, held: Mapping[int, Processed]) -> dict[int, int]:
        """Messages left per held partition of `topic`. The ends are read with one admin request
        (asking the fetching consumer would queue behind its long-polling fetches); the consumer's
        position counts too, since it moves past transaction markers no message sits on (call
        between batches)."""
        if not held:
            return {}
        marks = self._kafka.watermarks(topic, held)
        consumer = self._consumer
        positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in held])}
        lag = {}
        for partition, (low, high) in marks.items():
            done = max(_or(held[partition].next_offset, low), positions.get(partition, -1))
            lag[partition] = max(0, high - done)
        return lag

    def group_lag(self, topic: str, held: Mapping[int, Processed]) -> dict[int, int]:
        """Messages left per partition of the whole input `topic`, by the group's committed offsets
        (this worker's own progress where it is further)."""
        kafka = self._kafka
        partitions = range(kafka.partition_count(topic) or 0)
        committed = kafka.committed_offsets(self._config.consumer_group, topic, partitions)
        marks = kafka.watermarks(topic, partitions)
        own = self.held_lag(topic, held)
        lag = {p: partition_lag(committed.get(p), low, high) for p, (low, high) in marks.items()}
        return {p: min(lag[p], own.get(p, lag[p])) for p in lag}

    def lags(self) -> list[dict[int, int]]:
        """The group's lag on each input: the state's topic first, then a re-keying app's source."""
        return [self.group_lag(topic, held) for topic, held in self._held()]

    def caught_up(self, idle: bool) -> bool:
        """Every held partition processed up to its end (and, re-keying, the group's source too,
        which feeds the repartition partitions held here); holding none (`idle`: for long enough
        to trust it), the whole group caught up. Never while partitions restore."""
        if self._assignments.restorations:
            return False
        if self._assignments.holds_nothing:
            return idle and not any(any(lag.values()) for lag in self.lags())
        if any(any(self.held_lag(topic, held).values()) for topic, held in self._held()):
            return False
        if self._streams is not None and not self._streams.caught_up(self._assignments.transactions):
            return False
        rekeying = self._assignments.rekeying
        # The repartition topic's partitions held here are fed by every member's source partitions.
        return rekeying is None or self._pinned or not any(self.group_lag(rekeying.topic, rekeying.positions).values())


def _or(offset: int | None, default: int) -> int:
    return default if offset is None else offset
