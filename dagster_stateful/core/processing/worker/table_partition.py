"""One partitioned table's partition held by a worker: its local database, and its uncommitted work.

Owns `TablePartition`: a RocksDB database (`tables/<table>/<partition>` under the app's directory,
locked against another worker of this machine) holding the latest value of each key (a versioned
table: every version kept in its history, `state.versions`) and, in the same write batch, the
offset of the next table record to apply and the newest timestamp applied. Changes applied since
the last commit stay in memory (`overlay`) until the task's commit went through (`commit`), and
are dropped by a roll-back; the records fetched but not yet applied wait in `pending`.
"""

from __future__ import annotations

import shutil
from collections import deque
from pathlib import Path

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


def position_of(message: Message) -> int:
    return position(message)[2]


class TablePartition:
    """One table's partition held here: its local database, what is applied but not yet committed,
    and the records fetched but not yet applied."""

    def __init__(self, table: Table, partition: int, path: Path) -> None:
        self.table = table
        self.partition = partition
        self.topic_partition = TopicPartition(table.topic, partition)
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock = PartitionLock(path.with_name(f"{partition}.lock"), f"table {table.name!r} partition {partition}")
        self.database: PartitionDatabase | None = None
        self.overlay: dict[bytes, bytes | None] = {}
        """Changes applied since the last commit."""
        self.pending: deque[Message] = deque()
        """Records fetched in offset order, not applied yet."""
        self.prefetched: dict[bytes, bytes | None] = {}
        """Rows of the database read ahead for one batch's records with one multi-get (`prefetch`);
        forgotten whenever the database is written."""
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
        self.prefetched.clear()
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

    def prefetch(self, keys: list[bytes]) -> None:
        """Read the rows of `keys` from the database at once (one RocksDB multi-get), in place of
        those read ahead for the batch before."""
        assert self.database is not None
        self.prefetched = dict(zip(keys, self.database.get_many(keys), strict=True))

    def lookup(self, key: bytes, timestamp: int) -> bytes | None:
        """The row a record with `key` and `timestamp` joins."""
        overlay, prefetched = self.overlay, self.prefetched
        if key in overlay:
            raw = overlay[key]
        elif key in prefetched:
            raw = prefetched[key]
        else:
            raw = self.database.get(key)  # type: ignore[union-attr]  # open while held
        history = self.table.history_ms
        if history is None:
            return raw
        return versions.as_of(raw, timestamp, history, self.newest)

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
        self.overlay.clear()
        self.prefetched.clear()
        self.committed, self.committed_newest = self.applied, self.newest

    def roll_back(self) -> None:
        self.start_at(self.committed, self.committed_newest)

    def close(self) -> None:
        if self.database is not None:
            self.database.close()
            self.database = None
        self._lock.release()
