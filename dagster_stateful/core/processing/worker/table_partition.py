"""One partitioned table's partition held by a worker: its local database, and its uncommitted work.

Owns `TablePartition`: a RocksDB database (`tables/<table>/<partition>` under the app's directory,
locked against another worker of this machine) holding the latest value of each key (a versioned
table: every version kept in its history, `state.versions`) and, in the same write batch, the
offset of the next table record to apply and the newest timestamp applied. Changes applied since
the last commit stay in memory (`overlay`) until the task's commit went through (`commit`), and
are dropped by a roll-back; the records fetched but not yet applied wait in `pending`. Rows read
from the database for the records that join them are kept in memory (`rows`, within a budget)
until a commit writes them; a join reads its record's row (`row`) through the `JoiningRecord` the
worker's tables point at the record being processed.
"""

from __future__ import annotations

import shutil
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Message, TopicPartition

from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.processing.dsl.joins import Table
from dagster_stateful.core.state import versions
from dagster_stateful.core.state.locks import PartitionLock
from dagster_stateful.core.state.rocksdb import PartitionDatabase

POSITION_KEY = b"position"
"""Meta key: (offset of the next record to apply, newest timestamp applied) as JSON."""
NO_TIME = -1
ROW_BYTES = 150
"""About what Python adds to the key's and value's bytes of each row kept (two objects, a dict entry)."""
_UNREAD: Any = object()
"""What a row not found in memory is read as (None is a row: the key holds nothing)."""


def position_of(message: Message) -> int:
    return position(message)[2]


class JoiningRecord:
    """The key and timestamp of the record the joins are pointed at (one per worker's tables)."""

    __slots__ = ("key", "timestamp")

    def __init__(self) -> None:
        self.key = b""
        self.timestamp = 0


class TablePartition:
    """One table's partition held here: its local database, what is applied but not yet committed,
    and the records fetched but not yet applied."""

    def __init__(self, table: Table, partition: int, path: Path, record: JoiningRecord | None = None) -> None:
        """record: the record being processed, whose row `row` reads (the worker's tables share one)."""
        self.table = table
        self.partition = partition
        self._record = record if record is not None else JoiningRecord()
        self.topic_partition = TopicPartition(table.topic, partition)
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock = PartitionLock(path.with_name(f"{partition}.lock"), f"table {table.name!r} partition {partition}")
        self.database: PartitionDatabase | None = None
        self.overlay: dict[bytes, bytes | None] = {}
        """Changes applied since the last commit."""
        self.pending: deque[Message] = deque()
        """Records fetched in offset order, not applied yet."""
        self.rows: dict[bytes, bytes | None] = {}
        """Rows of the database read ahead for the records that join them, a batch's with one
        multi-get (`prefetch`), and kept while they fit its budget; a row written to the database is
        forgotten."""
        self._rows_bytes = 0
        self.applied = 0
        """The offset of the next record to apply (with what the overlay holds)."""
        self.newest = NO_TIME
        """The newest timestamp applied (a versioned table's history is counted back from it)."""
        self.committed = 0
        self.committed_newest = NO_TIME
        self.fetched = 0
        """The offset after the last record (or end) the table consumer handed over."""
        self.paused = False
        """Whether fetching waits for the pending records to be applied."""
        self.assigned = False
        """Whether the table consumer fetches the partition."""

    def open(self, lock_seconds: float) -> tuple[int | None, int]:
        """Open the database; returns its (offset, newest timestamp), or (None, -1) with nothing stored."""
        self._lock.acquire(lock_seconds)
        self.database = PartitionDatabase(self.path, store=f"table {self.table.name}", partition=self.partition)
        stored = self.database.get_meta(POSITION_KEY)
        if stored is None:
            return None, NO_TIME
        offset, newest = orjson.loads(stored)
        return int(offset), int(newest)

    def wipe(self) -> None:
        assert self.database is not None
        self.database.close()
        shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        self._forget_rows()
        self.database = PartitionDatabase(self.path, store=f"table {self.table.name}", partition=self.partition)

    def start_at(self, offset: int, newest: int) -> None:
        """Everything below `offset` is applied and committed."""
        self.applied = self.committed = self.fetched = offset
        self.newest = self.committed_newest = newest
        self.overlay.clear()
        self.pending.clear()

    def get(self, key: bytes) -> bytes | None:
        if key in self.overlay:
            return self.overlay[key]
        assert self.database is not None
        return self.database.get(key)

    def prefetch(self, keys: list[bytes], budget: int) -> None:
        """Read the rows of `keys` (repeated ones too) that are not in memory yet from the database at
        once (one RocksDB multi-get), and keep them (`rows`), in about `budget` bytes: when they would
        not fit, the rows kept before but those of `keys` are forgotten."""
        assert self.database is not None
        overlay, rows = self.overlay, self.rows
        missing = [key for key in keys if key not in rows]
        if overlay:
            missing = [key for key in missing if key not in overlay]
        if not missing:
            return
        missing = list(dict.fromkeys(missing))
        found = dict(zip(missing, self.database.get_many(missing), strict=True))
        size = _size(found.items())
        if self._rows_bytes + size > budget:
            self._keep_only(keys)
        self.rows.update(found)
        self._rows_bytes += size

    def _keep_only(self, keys: list[bytes]) -> None:
        """Forget the rows kept but those of `keys` (the ones the batch's records read)."""
        rows = self.rows
        self.rows = {key: rows[key] for key in keys if key in rows}
        self._rows_bytes = _size(self.rows.items())

    def _forget_rows(self) -> None:
        self.rows = {}
        self._rows_bytes = 0

    def row(self) -> bytes | None:
        """The row the record being processed joins (its key's latest value, or a versioned table's
        value as of its timestamp): what was applied since the last commit, else the rows kept, else
        the database's."""
        key = self._record.key
        raw = self.overlay.get(key, _UNREAD)
        if raw is _UNREAD:
            raw = self.rows.get(key, _UNREAD)
            if raw is _UNREAD:
                raw = self.database.get(key)  # type: ignore[union-attr]  # open while held
        history = self.table.history_ms
        if history is None:
            return raw
        return versions.as_of(raw, self._record.timestamp, history, self.newest)

    def apply(self, key: bytes, value: bytes | None, offset: int, timestamp: int) -> None:
        history = self.table.history_ms
        if history is None:
            self.overlay[key] = value
        else:
            self.newest = max(self.newest, timestamp)
            self.overlay[key] = versions.put(self.get(key), timestamp, value, history, self.newest)
        self.applied = offset + 1

    def skip(self, offset: int) -> None:
        self.applied = offset + 1

    def commit(self) -> None:
        """Write what was applied since the last commit, with the offset reached, in one write batch."""
        if self.applied == self.committed and not self.overlay:
            return
        assert self.database is not None
        meta = {POSITION_KEY: orjson.dumps([self.applied, self.newest])}
        self.database.write(list(self.overlay.items()), meta)
        rows = self.rows
        for key in self.overlay:
            rows.pop(key, None)
        self.overlay.clear()
        self.committed, self.committed_newest = self.applied, self.newest

    def roll_back(self) -> None:
        self.start_at(self.committed, self.committed_newest)

    def close(self) -> None:
        if self.database is not None:
            self.database.close()
            self.database = None
        self._lock.release()


def _size(rows: Iterable[tuple[bytes, bytes | None]]) -> int:
    """About how much memory `rows` take (`ROW_BYTES` each, with their bytes)."""
    return sum(len(key) + (len(value) if value else 0) + ROW_BYTES for key, value in rows)
