"""Whether a table and the records that join it are really co-partitioned: the same key in the same partition.

Owns `PlacementCheck`. Equal partition counts (checked before processing) are not enough: the
producers of both topics must also place keys alike. A Java producer (and librdkafka's
`murmur2_random`) puts a key where murmur2 says, librdkafka's default (`consistent_random`) where
CRC-32 says; a table written with one and joined with records placed by the other misses most
keys, silently. So the first records of each partition read in a run, of the table and of the
task's topic (the keys of a consumed batch, before any of them joins), are checked against both
partitioners (`kafka.partitioner`): each side keeps the partitioners that placed every key it
sampled where it is, and when no partitioner is left that both sides agree on, the run stops
(`TopicMismatchError`) before a record joins a table placed differently. Records the app re-keyed
itself are placed by murmur2.
"""

from __future__ import annotations

from dagster_stateful.core.kafka.partitioner import PARTITIONERS, Partitioner, partition_of
from dagster_stateful.errors import TopicMismatchError

SAMPLED_PER_PARTITION = 200
"""Keys checked per partition of each side, per run."""


class PlacementCheck:
    def __init__(self, task_topic: str, partitions: int, rekeyed: bool) -> None:
        """rekeyed: the task's topic is the app's repartition topic, which it writes with murmur2."""
        self._task_topic = task_topic
        self._partitions = partitions
        self._stream: set[Partitioner] = {"murmur2"} if rekeyed else set(PARTITIONERS)
        self._tables: dict[str, set[Partitioner]] = {}
        self._sampled: dict[tuple[str, int], int] = {}

    def stream_keys(self, partition: int, keys: list[bytes]) -> None:
        """Check the keys of records read from the task topic's `partition` (the first ones only)."""
        if self._partitions <= 1:
            return
        for key in keys:
            if not self._sample(self._task_topic, partition):
                return
            self._stream &= _placing(key, partition, self._partitions)
            self._check()

    def table_record(self, topic: str, partition: int, key: bytes) -> None:
        if self._partitions > 1 and self._sample(topic, partition):
            kept = self._tables.setdefault(topic, set(PARTITIONERS))
            kept &= _placing(key, partition, self._partitions)
            self._check()

    def _sample(self, topic: str, partition: int) -> bool:
        seen = self._sampled.get((topic, partition), 0)
        if seen >= SAMPLED_PER_PARTITION:
            return False
        self._sampled[(topic, partition)] = seen + 1
        return True

    def _check(self) -> None:
        for topic, table in self._tables.items():
            if not table & self._stream:
                raise TopicMismatchError(
                    f"table topic {topic} and the records that join it ({self._task_topic}) have the same partition "
                    f"count but place keys differently: {_described(table)} for the table, {_described(self._stream)} "
                    f"for {self._task_topic}, so most records would find no row. Write both with the same "
                    "partitioner: Kafka's default (murmur2: the Java client's, or librdkafka's "
                    "partitioner=murmur2_random), which the app's own repartition topic uses."
                )


def _placing(key: bytes, partition: int, partitions: int) -> set[Partitioner]:
    placing: set[Partitioner] = set()
    for partitioner in PARTITIONERS:
        try:
            if partition_of(key, partitions, partitioner) == partition:
                placing.add(partitioner)
        except ValueError:  # an empty key, which the consistent partitioner places at random
            continue
    return placing


def _described(partitioners: set[Partitioner]) -> str:
    return " or ".join(sorted(partitioners)) if partitioners else "no single partitioner"
