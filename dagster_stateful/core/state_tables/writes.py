"""Writing a store's state from outside its workers: changelog records, and a snapshot of them.

Owns what a bootstrap and a migration share: refusing while the app's workers run
(`refuse_group_members`), reading which keys the changelog holds (`live_changelog_keys`), writing
records to it with the `state_write` header, so that restores count them as committed state
wherever they lie (`write_changelog`), and publishing a snapshot of rows written so (`publish_snapshot`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import FETCH_QUEUE_BACKOFF_MS, KafkaClients
from dagster_stateful.core.recovery.changelog_format import STATE_WRITE_HEADERS
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.errors import DeliveryError, StateTableError

__all__ = ["live_changelog_keys", "publish_snapshot", "refuse_group_members", "write_changelog"]

READ_TIMEOUT = 60.0


def refuse_group_members(kafka: KafkaClients, config: AppConfig, doing: str) -> None:
    """Refuse while the app's consumer group has members: its workers would write the store too."""
    group = kafka.describe_group(config.consumer_group, config.task_topic)
    if group.members:
        raise StateTableError(
            f"consumer group {config.consumer_group!r} of app {config.name!r} has {len(group.members)} member(s) "
            f"({', '.join(member.client_id for member in group.members)}): stop its workers before {doing} store state"
        )


def live_changelog_keys(kafka: KafkaClients, changelog: str, partitions: Iterable[int]) -> dict[int, set[bytes]]:
    """Per partition, the keys whose latest changelog record is not a tombstone (read to the current end)."""
    partitions = list(partitions)
    ends = {p: high for p, (_, high) in kafka.watermarks(changelog, partitions, committed=True).items()}
    live: dict[int, set[bytes]] = {p: set() for p in partitions}
    pending = {p for p in partitions if ends[p] > 0}
    reader = kafka.consumer(
        {
            "group.id": f"{changelog}-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,  # the end may be a transaction marker or a tombstone compaction removed
            "isolation.level": "read_committed",
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    deadline = time.monotonic() + READ_TIMEOUT
    try:
        reader.assign([TopicPartition(changelog, p, 0) for p in pending])
        while pending:
            if time.monotonic() > deadline:
                raise StateTableError(f"reading changelog {changelog} to its end took over {READ_TIMEOUT:.0f} s")
            for message in reader.consume(10_000, timeout=1.0):
                _note(message, live, ends, pending)
    finally:
        reader.close()
    return live


def _note(message: Message, live: dict[int, set[bytes]], ends: dict[int, int], pending: set[int]) -> None:
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            pending.discard(message.partition())
            return
        raise StateTableError(f"reading changelog {message.topic()}: {error.str()}")
    partition, offset, key = message.partition() or 0, message.offset() or 0, message.key()
    if key is not None:
        (live[partition].discard if message.value() is None else live[partition].add)(key)
    if offset + 1 >= ends[partition]:
        pending.discard(partition)


def write_changelog(
    kafka: KafkaClients,
    changelog: str,
    rows: Mapping[int, list[tuple[bytes, bytes]]],
    tombstones: Mapping[int, set[bytes]],
) -> dict[int, list[int]]:
    """Write the tombstones, then the rows (`state_write` header: committed state); returns each partition's
    rows' offsets, in row order. Raises `DeliveryError` unless every record was acknowledged."""
    producer = kafka.producer({"enable.idempotence": True, "acks": "all", "linger.ms": 20})
    offsets: dict[int, list[int]] = {p: [0] * len(kept) for p, kept in rows.items()}
    failures: list[str] = []

    def delivered(partition: int, index: int | None):
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(f"partition {partition}: {error.str()}")
            elif index is not None:
                offsets[partition][index] = message.offset() or 0

        return report

    def send(partition: int, key: bytes, value: bytes | None, index: int | None) -> None:
        report = delivered(partition, index)
        producer.produce(
            changelog, key=key, value=value, partition=partition, headers=STATE_WRITE_HEADERS, on_delivery=report
        )
        producer.poll(0)

    for partition, keys in tombstones.items():
        for key in sorted(keys):
            send(partition, key, None, None)
    for partition, kept in rows.items():
        for index, (key, value) in enumerate(kept):
            send(partition, key, value, index)
    left = producer.flush(READ_TIMEOUT)
    if left or failures:
        raise DeliveryError(
            f"writing the state to changelog {changelog}: {left} record(s) undelivered, failures {failures[:5]}; no "
            "source offset was committed: run the bootstrap again with replace=True"
        )
    return offsets


def publish_snapshot(
    snapshots: SnapshotStore,
    changelog: str,
    rows: Mapping[int, list[tuple[bytes, bytes]]],
    offsets: Mapping[int, list[int]],
    ends: dict[int, int],
    positions: Mapping[int, int | None],
    written_by: str,
) -> SnapshotManifest:
    """A new snapshot of `rows` (each partition's sorted by key, with their changelog `offsets`),
    covering the changelog up to `ends`, published with its manifest."""
    previous = snapshots.latest()
    snapshot_id = snapshots.new_snapshot_id()
    for partition, kept in rows.items():
        snapshots.write_partition(snapshot_id, partition, kept, offsets[partition])
    manifest = SnapshotManifest(
        app=snapshots.app,
        store=snapshots.store,
        changelog_topic=changelog,
        snapshot_id=snapshot_id,
        created_at=time.time(),
        end_offsets=ends,
        key_counts={p: len(kept) for p, kept in rows.items()},
        previous=previous.snapshot_id if previous else None,
        extra={
            "written_by": written_by,
            "changelog_end_offsets": {str(p): end for p, end in sorted(ends.items())},
            "committed_source_offsets": {str(p): offset for p, offset in sorted(positions.items())},
        },
    )
    snapshots.write_manifest(manifest)
    return manifest
