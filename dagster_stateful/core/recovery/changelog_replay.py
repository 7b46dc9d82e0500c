"""Changelog replay: bring a store partition up to date from its changelog, in steps.

Owns `ChangelogRestore`: one partition's replay, advanced one batch at a time so that a worker
keeps polling between batches, and interruptible without losing what it restored (`restorer`
decides which replay a store needs). A partition without local state replays the whole changelog
(full restore); one with state replays only the tail after its stored changelog offset (partial
restore). Records of uncommitted messages follow the at-least-once rule of
`uncommitted.UncommittedFilter`, and the recorded position never passes the first of them. A
partial restore deduplicates each batch by key and writes it sorted, in one WriteBatch with the
changelog position; a full restore gathers the last value per key over many batches (a chunk of
up to `FULL_RESTORE_CHUNK_RECORDS` keys) and ingests each chunk as sorted SST files, so the
rebuilt store is written once, already compacted, instead of through the memtable. Each
restore's end or suspension is logged through `restore_log`. Also `RestoreTarget`, what a replay
writes into: a `StorePartition`, or the SST files of a full restore run in another process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from operator import itemgetter
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.gc_pause import gc_paused
from dagster_stateful.core.kafka.records import position as record_position
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.authorization import authorization_error, is_authorization_failure
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.recovery.changelog_format import (
    SOURCE_OFFSET_HEADER,
    Block,
    bare_uncommitted_from,
    processed_bytes,
    read_block,
)
from dagster_stateful.core.recovery.restore_log import RESTORE_REPORT_FIELD, log_restored
from dagster_stateful.core.recovery.uncommitted import UncommittedFilter, decode_processed_offset
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

STALL_TIMEOUT = 60.0
BATCH_WAIT = 0.5
"""Seconds a restore step waits for its batch before the worker's loop gets the thread back."""
BATCH_WAIT_SLICE = 0.02
FULL_RESTORE_CHUNK_RECORDS = 250_000
"""Keys a full restore holds in memory before it ingests them (about 50 MB at 200 bytes a key; twice
as many were no faster: bench/bench_restore_memory.py)."""
PROGRESS_LOG_INTERVAL = 10.0
_error_of = Message.error
_key_of, _value_of, _offset_of = Message.key, Message.value, Message.offset
_first = itemgetter(0)


class RestoreTarget(Protocol):
    """Where a `ChangelogRestore` writes: a `StorePartition`, or the SST files of a full restore run
    in another process (`parallel_replay.SstFilesTarget`)."""

    store: str
    partition: int
    changelog_topic: str
    changelog_offset: int | None
    source_offset: int | None
    changelog_prefix: ChangelogPrefix | None
    keys_to_rewrite: set[bytes]

    def holds(self, key: bytes) -> bool: ...

    def write_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None: ...

    def ingest_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None: ...

    def finish_restore(self, changelog_offset: int, source_offset: int | None) -> None: ...

    def flush(self) -> None: ...


class ChangelogRestore:
    """One store partition's replay from `start` to `end` (the changelog's end when it began).

    `step()` reads and writes one batch; `finish()` makes the result durable with its position;
    `suspend()` stops early, keeping what was restored and its position for the next owner.
    """

    def __init__(
        self,
        consumer: Consumer,
        listeners: Listeners,
        store: RestoreTarget,
        committed_source_offset: int | None,
        start: int,
        end: int,
        batch_size: int,
        chunk_records: int = FULL_RESTORE_CHUNK_RECORDS,
        group: str = "",
        committed_end: int | None = None,
        clean_base: bool = False,
        bare_uncommitted: bool = False,
    ) -> None:
        """group: the consumer's group id (assigned, never joined), named when Kafka refuses it.
        committed_end: the changelog end the group's last commit recorded (`commit_metadata`): the
        records below it are taken without reading their header. clean_base: the store's own state
        (if any) lies below that end, so that a finished restore knows the changelog's committed
        prefix (`committed_prefix`). bare_uncommitted: that commit counts records without headers
        at or past its end as uncommitted (`changelog_format`)."""
        self.store = store
        self._group = group
        self.committed_end, self.clean_base = committed_end, clean_base
        self.bare_uncommitted = bare_uncommitted
        self.bare_uncommitted_from = bare_uncommitted_from(committed_source_offset, committed_end, bare_uncommitted)
        """The changelog offset from which a record without headers is of an uncommitted message (None: none is)."""
        self.committed_source_offset = committed_source_offset
        self.start, self.end, self.position = start, end, start
        kind = RestoreKind.FULL if store.changelog_offset is None else RestoreKind.PARTIAL
        self.report = RestoreReport(store.store, store.partition, kind, start, end)
        self._consumer = consumer
        self._listeners = listeners
        self._batch_size = batch_size
        self._topic_partition = TopicPartition(store.changelog_topic, store.partition, start)
        self._batch: dict[bytes, bytes | None] = {}
        self._bulk = kind is RestoreKind.FULL
        self._chunk_records = chunk_records
        restored = self._restored_here if self._bulk else None
        at_committed = not self._bulk and store.source_offset == committed_source_offset
        self.filter = UncommittedFilter(committed_source_offset, restored, 0 if self._bulk else start, at_committed)
        self._block: Block | None = None
        """The last block (`changelog_format`) read: the records without headers up to its end are its."""
        self._started: float | None = None
        self._last_progress = self._last_log = time.monotonic()
        # A standby replica's tails log their end at debug and never wait for a batch (processing comes first).
        self.log_level, self.batch_wait = logging.INFO, BATCH_WAIT

    @property
    def done(self) -> bool:
        return self.position >= self.end

    @property
    def started(self) -> bool:
        return self._started is not None

    @property
    def records_left(self) -> int:
        return max(0, self.end - self.position)

    def step(self) -> int:
        """Read and write one batch; returns the records it applied."""
        if self._started is None:
            self._begin()
        if self.done:
            return 0
        with gc_paused():
            return self._step()

    def _step(self) -> int:
        messages = self._read_batch()
        if not messages:
            self._note_no_records()
            return 0
        self._raise_errors(messages)
        skipped = self.filter.skipped
        self._note_offsets(messages)
        self._deduplicate(messages)
        self.position = record_position(messages[-1])[2] + 1
        self._last_progress = time.monotonic()
        if self._bulk:
            applied = len(messages) - (self.filter.skipped - skipped)
            if len(self._batch) >= self._chunk_records:
                self._ingest_chunk()
        else:
            applied = len(self._batch)
            self.store.write_restored(_in_key_order(self._batch), self.filter.resume_offset(self.position))
            self._batch = {}
        self.report.records_applied += applied
        self._listeners.batch_restored(self.store.partition, self.store.store, self.position, applied)
        self._log_progress()
        return applied

    def finish(self) -> RestoreReport:
        """Record the restored state durably, with the position the next restore starts from."""
        self._stop_reading()
        self._ingest_chunk()
        self._complete_report()
        self.store.finish_restore(self.filter.resume_offset(self.end), self.committed_source_offset)
        self.store.keys_to_rewrite.update(self.filter.rewrite)
        self.store.changelog_prefix = self.committed_prefix(self.report)
        self._listeners.restore_end(self.store.partition, self.store.store, self.report.records_applied)
        log_restored(self.report, self.store.changelog_topic, str(self.report.kind), self.filter.gap_at, self.log_level)
        return self.report

    def suspend(self) -> RestoreReport:
        """Stop before the end (revocation, shutdown): what was restored stays, with its position."""
        self._stop_reading()
        self._complete_report()
        self.report.completed = False
        self._ingest_chunk()
        self.store.flush()
        self._listeners.restore_suspended(self.store.partition, self.store.store, self.report.records_applied)
        log.info(
            "Suspended the restore of store %r partition %d at changelog offset %d of %d (%d records applied); "
            "the next owner continues from there",
            self.store.store,
            self.store.partition,
            self.position,
            self.end,
            self.report.records_applied,
            extra={RESTORE_REPORT_FIELD: self.report},
        )
        return self.report

    def _ingest_chunk(self) -> None:
        """A full restore's gathered keys into the store, as SST files, with the position they reach."""
        if self._batch:
            with gc_paused():
                self.store.ingest_restored(_in_key_order(self._batch), self.filter.resume_offset(self.position))
            self._batch = {}

    def _begin(self) -> None:
        self._started = self._last_progress = self._last_log = time.monotonic()
        self._consumer.assign([self._topic_partition])
        self._listeners.restore_start(self.store.partition, self.store.store, self.start, self.end)

    def _stop_reading(self) -> None:
        if self._started is not None:
            self._consumer.unassign()

    def committed_prefix(self, report: RestoreReport) -> ChangelogPrefix | None:
        """What a finished restore knows of the changelog below its end (None: nothing, its store's
        own state came from elsewhere), given what it met of the uncommitted records (`report`: this
        restore's, or of a child process that ran it)."""
        if not self.clean_base:
            return None
        return ChangelogPrefix.read(
            self.end,
            self.committed_source_offset,
            report.uncommitted_processed_up_to,
            report.bare_uncommitted_read,
        )

    def _complete_report(self) -> None:
        up_to = self.filter.processed_up_to
        self.report.uncommitted_processed_up_to = None if up_to is None else decode_processed_offset(up_to)
        self.report.bare_uncommitted_read = self.filter.bare_uncommitted_read
        self.report.records_skipped = self.filter.skipped
        self.report.records_uncommitted_applied = self.filter.applied_uncommitted
        self.report.seconds = time.monotonic() - self._started if self._started is not None else 0.0

    def _note_offsets(self, messages: list[Message]) -> None:
        if self.filter.gap_at is None:
            first, last = record_position(messages[0])[2], record_position(messages[-1])[2]
            self.filter.note_batch(first, last, len(messages), lambda: (record_position(m)[2] for m in messages))

    def _restored_here(self, key: bytes) -> bool:
        return key in self._batch or self.store.holds(key)

    def _deduplicate(self, messages: list[Message]) -> None:
        """The batch's last value per key (None: tombstone), under the at-least-once rule.

        This loop runs once per changelog record, so it is written for speed: the header the commit
        path writes (one, an 8-byte big-endian offset) is compared as bytes, which orders like the
        offsets, and the filter is consulted only where it has something to decide or remember.
        """
        last = _offset_of(messages[-1])
        if self.committed_end is not None and last is not None and last < self.committed_end:
            keys: list[Any] = list(map(_key_of, messages))
            if None not in keys:
                values = list(map(_value_of, messages))
                self.filter.admit_committed_batch(keys, values)
                self._batch.update(zip(keys, values, strict=True))
                self.report.records_below_committed_end += len(keys)
                return
        batch, uncommitted = self._batch, self.filter
        committed_bytes = uncommitted.committed_bytes
        remember_committed = uncommitted.remembers_committed_keys
        bare_from = self.bare_uncommitted_from
        block = self._block
        block_end = -1 if block is None else block.end
        block_uncommitted = block is not None and block.first_offset >= committed_bytes
        for message in messages:
            key = message.key()
            if key is None:
                error = message.error()
                if error is not None:
                    raise KafkaException(error)
                continue  # the engine never writes keyless records; nothing to restore
            value = message.value()
            headers = message.headers()
            processed: bytes | None = None
            if isinstance(headers, list) and headers:
                name, raw = headers[0]
                if len(headers) == 1 and name == SOURCE_OFFSET_HEADER and isinstance(raw, bytes) and len(raw) == 8:
                    processed = raw
                elif (started := read_block(headers, at := message.offset() or 0)) is not None:
                    block = self._block = started
                    block_end, block_uncommitted = started.end, started.first_offset >= committed_bytes
                    if block_uncommitted:
                        if uncommitted.admit_uncommitted(key, at, started.last_processed, in_block=True):
                            batch[key] = value
                        continue
                else:
                    processed = processed_bytes(headers)
            elif (at := message.offset() or 0) < block_end:
                # A record of the block: as one whose header named the block's first offset would be.
                if block_uncommitted:
                    assert block is not None
                    if uncommitted.admit_uncommitted(key, at, block.last_processed, in_block=True):
                        batch[key] = value
                    continue
            elif bare_from is not None and at >= bare_from:
                if not uncommitted.admit_uncommitted(key, at):
                    continue
                batch[key] = value
                continue
            if processed is not None and processed >= committed_bytes:
                offset = message.offset()
                if not uncommitted.admit_uncommitted(key, offset if offset is not None else self.position, processed):
                    continue
            elif remember_committed or value is None:
                uncommitted.admit_committed(key, value)
            batch[key] = value

    def _raise_errors(self, messages: list[Message]) -> None:
        """Raise the first error Kafka handed over among `messages` (the end of a partition is none);
        a refused ACL as the `KafkaAuthorizationError` naming it."""
        for error in filter(None, map(_error_of, messages)):  # no Python step per record without errors
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            if is_authorization_failure(error):
                topic = self.store.changelog_topic
                needs = [
                    AclRequirement(ResourceType.TOPIC, topic, Operation.READ),
                    AclRequirement(ResourceType.GROUP, self._group, Operation.DESCRIBE),
                ]
                raise authorization_error(error, f"replaying {topic}[{self.store.partition}]", needs)
            raise KafkaException(error)

    def _read_batch(self) -> list[Message]:
        """The next batch of records, waiting at most `batch_wait` for them. consume() waits for a full
        batch, so it asks for no more than the offsets left, and in short slices: offsets no record
        sits on (a transaction's marker, compacted records) would keep it waiting for records that
        never come; between slices the consumer's position shows the range read to its end."""
        wanted = min(self._batch_size, self.end - self.position)
        deadline = time.monotonic() + self.batch_wait
        while True:
            messages = self._consumer.consume(wanted, timeout=min(BATCH_WAIT_SLICE, self.batch_wait))
            if messages or time.monotonic() >= deadline:
                return messages
            if self._consumer.position([self._topic_partition])[0].offset >= self.end:
                return messages

    def _note_no_records(self) -> None:
        # Compaction and transaction markers leave offsets no record sits on.
        self.position = max(self.position, self._consumer.position([self._topic_partition])[0].offset)
        if not self.done and time.monotonic() - self._last_progress > STALL_TIMEOUT:
            raise RecoveryError(
                f"restoring store {self.store.store!r} from {self.store.changelog_topic}[{self.store.partition}] "
                f"made no progress for {STALL_TIMEOUT:.0f} s at offset {self.position} (end {self.end}); "
                "is the broker reachable?"
            )

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_log < PROGRESS_LOG_INTERVAL or self._started is None:
            return
        self._last_log = now
        done = self.position - self.start
        rate = done / max(now - self._started, 1e-9)
        log.info(
            "Restoring store %r partition %d: %d of %d changelog records (%.0f%%), %.0f records/s, about %.0f s left",
            self.store.store,
            self.store.partition,
            done,
            self.end - self.start,
            100.0 * done / max(1, self.end - self.start),
            rate,
            self.records_left / max(rate, 1e-9),
        )


def _in_key_order(batch: dict[bytes, bytes | None]) -> list[tuple[bytes, bytes | None]]:
    """The batch's records sorted by key. Its keys are unique, so comparing the keys alone orders it;
    comparing the (key, value) tuples took about 2.5 times as long on keys in changelog order."""
    return sorted(batch.items(), key=_first)
