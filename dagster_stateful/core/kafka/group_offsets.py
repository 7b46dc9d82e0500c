"""Where a consumer group resumes, set from outside the group: offsets committed for it, and the offsets of a moment.

Owns `commit_group_offsets` (the group's committed offsets on a topic, set by a client that never
joins it; the broker refuses while the group has members) and `offsets_for_time` (per partition,
the offset of the first message at or after a timestamp, through the broker's offsets-for-times,
and the partition's end where no message is that late).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import TopicPartition

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.error_codes import kafka_errors
from dagster_stateful.errors import KafkaOperationError

__all__ = ["commit_group_offsets", "offsets_for_time"]

TIMEOUT = 30.0


def commit_group_offsets(
    kafka: KafkaClients,
    group: str,
    topic: str,
    offsets: Mapping[int, int],
    metadata: Mapping[int, str] | None = None,
) -> None:
    """Commit `offsets` (partition -> next offset to process) for `group` on `topic`, each with its
    `metadata` (none where it gives none)."""
    metadata = metadata or {}
    what = f"committing offsets {dict(sorted(offsets.items()))} of {topic} for consumer group {group!r}"
    committer = kafka.consumer({"group.id": group, "enable.auto.commit": False})
    try:
        with kafka_errors(what):
            result = committer.commit(
                offsets=[TopicPartition(topic, p, o, metadata.get(p, "")) for p, o in sorted(offsets.items())],
                asynchronous=False,
            )
    finally:
        committer.close()
    failed = [tp for tp in result or () if tp.error is not None]
    if failed:
        details = ", ".join(f"partition {tp.partition}: {tp.error}" for tp in failed)
        raise KafkaOperationError(
            f"{what} failed ({details}); a group with members refuses offsets from outside: stop its workers first"
        )


def offsets_for_time(kafka: KafkaClients, topic: str, partitions: Iterable[int], timestamp_ms: int) -> dict[int, int]:
    """Per partition, the offset of its first message timestamped at or after `timestamp_ms` (its end if none is)."""
    partitions = sorted(partitions)
    reader = kafka.consumer({"group.id": f"offsets-for-times-{topic}", "enable.auto.commit": False})
    try:
        with kafka_errors(f"finding the offsets of {topic} at timestamp {timestamp_ms}"):
            found = reader.offsets_for_times([TopicPartition(topic, p, timestamp_ms) for p in partitions], TIMEOUT)
    finally:
        reader.close()
    ends = {p: high for p, (_, high) in kafka.watermarks(topic, partitions).items()}
    return {tp.partition: (tp.offset if tp.offset >= 0 else ends[tp.partition]) for tp in found}
