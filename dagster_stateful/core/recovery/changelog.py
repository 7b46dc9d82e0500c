"""Recovery: bring a store partition up to date from its changelog before it processes a message.

Owns the restore decision and the replay. A partition without local state replays the whole
changelog (full restore); one with state replays only the tail after its stored changelog offset
(partial restore). Records whose processed source offset (a header) is at or past the committed
source offset are skipped: they belong to messages that will be processed again. Replay consumes
thousands of records at a time, deduplicates each batch by key and writes it sorted, in one
WriteBatch with the changelog position. Inconsistencies an operator must decide on (a stored
offset beyond the changelog's end) are raised with the options.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.kafka.records import position as record_position
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

SOURCE_OFFSET_HEADER = "source_offset"
STALL_TIMEOUT = 60.0


def source_offset_header(offset: int) -> Headers:
    return [(SOURCE_OFFSET_HEADER, offset.to_bytes(8, "big", signed=True))]


def processed_offset(headers: Headers | None) -> int | None:
    for name, value in headers or ():
        if name == SOURCE_OFFSET_HEADER and isinstance(value, bytes):
            return int.from_bytes(value, "big", signed=True)
    return None


class Restorer:
    """Restores store partitions through one dedicated, assign-only consumer."""

    def __init__(self, consumer: Consumer, listeners: Listeners, batch_size: int = 10_000) -> None:
        self._consumer = consumer
        self._listeners = listeners
        self._batch_size = batch_size

    def restore(self, store: StorePartition, committed_source_offset: int | None) -> RestoreReport | None:
        """Replay what the store lacks; None when it was already up to date."""
        topic, partition = store.changelog_topic, store.partition
        low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
        stored = store.changelog_offset
        if stored is not None and stored > high:
            raise RecoveryError(
                f"store {store.store!r} partition {partition} at {store.path} has changelog offset {stored}, beyond "
                f"the end ({high}) of {topic}[{partition}]: the changelog was probably deleted and recreated, so it "
                "no longer matches the local state. Options: (1) clear this partition's local state "
                f"(App.clear_state(partitions=[{partition}]) or the clear-state job) and let it restore from what "
                "the changelog holds now; (2) restore it from a snapshot taken before the changelog was lost."
            )
        if stored is not None and stored < low:
            log.warning(
                "Store %r partition %d: stored changelog offset %d is below the changelog's low watermark "
                "%d (records were deleted); restoring the partition fully",
                store.store,
                partition,
                stored,
                low,
            )
            store.wipe()
            store.open()
            stored = None
        start = stored if stored is not None else low
        skip_from = committed_source_offset if committed_source_offset is not None else 0
        if start >= high:
            if stored is None or store.source_offset != committed_source_offset:
                store.finish_restore(high, committed_source_offset)
            return None
        kind = RestoreKind.PARTIAL if stored is not None else RestoreKind.FULL
        report = RestoreReport(store.store, partition, kind, start, high)
        began = time.monotonic()
        self._listeners.restore_start(partition, store.store, start, high)
        self._replay(store, start, high, skip_from, report)
        store.finish_restore(high, committed_source_offset)
        report.seconds = time.monotonic() - began
        self._listeners.restore_end(partition, store.store, report.records_applied)
        log.info(
            "Restored store %r partition %d (%s) from %s offsets %d..%d: %d records applied, %d skipped, %.2f s",
            store.store,
            partition,
            report.kind,
            topic,
            start,
            high,
            report.records_applied,
            report.records_skipped,
            report.seconds,
        )
        return report

    @staticmethod
    def _deduplicate(messages: list, skip_from: int, report: RestoreReport) -> dict[bytes, bytes | None]:
        """The batch's last value per key (None: tombstone), without records of uncommitted messages.

        This loop runs once per changelog record: the header written by the commit path (one,
        an 8-byte big-endian offset) is compared as bytes, which orders like the offsets.
        """
        skip_key = skip_from.to_bytes(8, "big", signed=True)
        batch: dict[bytes, bytes | None] = {}
        skipped = 0
        for message in messages:
            if message.error():
                raise KafkaException(message.error())
            headers = message.headers()
            if headers:
                name, value = headers[0]
                if name == SOURCE_OFFSET_HEADER and len(headers) == 1 and value is not None and len(value) == 8:
                    if value >= skip_key:
                        skipped += 1
                        continue
                else:
                    offset = processed_offset(headers)
                    if offset is not None and offset >= skip_from:
                        skipped += 1
                        continue
            batch[message.key()] = message.value()
        report.records_skipped += skipped
        return batch

    def _replay(self, store: StorePartition, start: int, end: int, skip_from: int, report: RestoreReport) -> None:
        topic_partition = TopicPartition(store.changelog_topic, store.partition, start)
        self._consumer.assign([topic_partition])
        position = start
        last_progress = time.monotonic()
        try:
            while position < end:
                # consume() waits for a full batch: ask for no more than the offsets left.
                messages = self._consumer.consume(min(self._batch_size, end - position), timeout=0.5)
                batch = self._deduplicate(messages, skip_from, report)
                if messages:
                    position = record_position(messages[-1])[2] + 1
                    last_progress = time.monotonic()
                    store.write_restored(sorted(batch.items()), position)
                    report.records_applied += len(batch)
                    self._listeners.batch_restored(store.partition, store.store, position, len(batch))
                else:
                    # Compaction and transaction markers leave offsets no record sits on.
                    position = max(position, self._consumer.position([topic_partition])[0].offset)
                    if time.monotonic() - last_progress > STALL_TIMEOUT:
                        raise RecoveryError(
                            f"restoring store {store.store!r} from {store.changelog_topic}"
                            f"[{store.partition}] made no progress for {STALL_TIMEOUT:.0f} s at "
                            f"offset {position} (end {end}); is the broker reachable?"
                        )
        finally:
            self._consumer.unassign()
