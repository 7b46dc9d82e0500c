"""Store partitions: one database per (app, store, Kafka partition), with its lock and offsets.

Owns one partition directory's content (the backend's files, RocksDB's by default, `.lock`,
`.checkpoint`, `.handover`), opening it safely (exclusive lock, waited for within a bound, with a
`.handover` request that makes a standby replica holding it let go; a corrupted database
is handed to the state directory's quarantine and the partition starts empty, to be fully
restored, while any other failure to open raises and moves nothing), the partition's two offsets
kept inside the database, committing data and offsets in one atomic write before publishing the
`.checkpoint` mirror, and finishing a restore so that its offsets become durable only after its data.
Its `metrics` (see `monitoring.store_metrics`) count the operations on it, the bytes read from it,
and take RocksDB's bytes written and pending compaction when its database closes.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dagster_stateful.core.state.backend import BackendFactory, StoreBackend
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.core.state.checkpoint import Checkpoint, read_checkpoint, remove_checkpoint, write_checkpoint
from dagster_stateful.core.state.locks import DEFAULT_LOCK_TIMEOUT_SECONDS, PartitionLock
from dagster_stateful.core.state.metrics import (
    PENDING_COMPACTION_PROPERTY,
    PartitionMetrics,
    RocksDBCounters,
)
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import ConfigurationError, StateLockedError, StateStoreError, StoreCorruptedError

log = logging.getLogger(__name__)

CHANGELOG_OFFSET_KEY = b"changelog_offset"
SOURCE_OFFSET_KEY = b"source_offset"
HANDOVER_FILE = ".handover"
"""Present while an opener (not a standby replica) waits for the partition's lock."""


def encode_offset(offset: int) -> bytes:
    return offset.to_bytes(8, "big", signed=True)


def _decode_offset(data: bytes | None) -> int | None:
    return None if data is None else int.from_bytes(data, "big", signed=True)


def _checked_timeout(seconds: float) -> float:
    if seconds < 0:
        raise ConfigurationError(f"a lock timeout is zero or more seconds, got {seconds}")
    return seconds


Quarantine = Callable[[Path, BaseException], Path]
"""Moves a corrupted partition directory aside and returns where it went (see `StateDirectory`)."""


class StorePartition:
    """One partition of one store. Open it before use; close it to hand it over.

    Built by `StateDirectory.partition`, which decides where it lives and where a corrupted copy goes.
    """

    def __init__(
        self,
        path: Path,
        store: str,
        partition: int,
        changelog_topic: str,
        source_topic: str,
        quarantine: Quarantine,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        backend: BackendFactory = PartitionDatabase,
    ) -> None:
        """lock_timeout: seconds `open()` waits for another holder of the partition's lock to let go;
        backend: what holds the data (RocksDB unless the store is declared otherwise)."""
        self.store = store
        self.partition = partition
        self.changelog_topic = changelog_topic
        self.source_topic = source_topic
        self.path = path
        self.lock_timeout = _checked_timeout(lock_timeout)
        self._quarantine = quarantine
        self._lock = PartitionLock(self.path / ".lock", f"state partition {partition} of store {store!r}")
        self._backend = backend
        self._db: StoreBackend | None = None
        self.changelog_offset: int | None = None
        self.source_offset: int | None = None
        self.changelog_prefix: ChangelogPrefix | None = None
        """What the worker knows of the changelog's committed records (set by its restores; in memory)."""
        self.keys_to_rewrite: set[bytes] = set()
        """Keys whose records in a crashed commit's block its restores skipped: the next commit writes their
        committed values again (`recovery.changelog_format`; in memory)."""
        self.recovered_from_corruption = False
        self.as_standby = False
        """Opened by a standby replica; its checkpoints say so."""
        self.kept_by_standby = False
        """Opened by an active owner where a standby replica of this client (this worker or another
        member sharing the state directory) last kept the data: its restore is a standby takeover."""
        self.metrics = PartitionMetrics()
        """What the state views and this partition did, counted while it is open."""

    @property
    def db(self) -> StoreBackend:
        if self._db is None:
            raise StateStoreError(f"state partition {self.path} is not open")
        return self._db

    @property
    def has_local_state(self) -> bool:
        """False for a new or wiped partition: it needs a full restore."""
        return self.changelog_offset is not None

    def open(self, lock_timeout: float | None = None, *, as_standby: bool = False) -> None:
        """Take the lock (waiting up to `lock_timeout` seconds, the partition's default when None; 0
        fails at once) and open the database. Raises `StateLockedError` when another holder keeps
        the lock, `StateStoreError` when RocksDB cannot open (nothing is moved unless it is corrupted).
        Unless `as_standby`, an opener that finds the lock held asks a standby replica holding it to
        let go (`handover_requested`)."""
        timeout = self.lock_timeout if lock_timeout is None else _checked_timeout(lock_timeout)
        try:
            self._lock.acquire(0.0)
        except StateLockedError:
            if as_standby:
                raise
            self._request_handover()
            self._lock.acquire(timeout)
        if not as_standby:
            (self.path / HANDOVER_FILE).unlink(missing_ok=True)
        try:
            self._db = self._open_database()
        except BaseException:
            self._lock.release()
            raise
        if not self._db.persistent:
            remove_checkpoint(self.path)  # a crashed worker's: its state went with it
        self._load_offsets()
        self._note_keeper(as_standby)

    def _note_keeper(self, as_standby: bool) -> None:
        """Who keeps the local state now: a standby says so in the checkpoint at once; an active
        opener learns from the checkpoint whether a standby kept it last."""
        self.as_standby = as_standby
        if not self.has_local_state:
            self.kept_by_standby = False
        elif as_standby:
            self.publish_checkpoint()
            self.kept_by_standby = False
        else:
            previous = read_checkpoint(self.path)
            self.kept_by_standby = previous is not None and previous.kept_by_standby

    @property
    def handover_requested(self) -> bool:
        """Whether an opener that is not a standby replica waits for this partition's lock."""
        return (self.path / HANDOVER_FILE).exists()

    def _request_handover(self) -> None:
        try:
            (self.path / HANDOVER_FILE).touch()
        except OSError as error:  # the opener then waits for the holder as it always did
            log.debug("Could not ask the holder of %s to hand it over: %s", self.path, error)

    def _open_database(self) -> StoreBackend:
        try:
            return self._backend(self.path, self.store, self.partition)
        except StoreCorruptedError as error:
            self._move_aside(error)
            return self._backend(self.path, self.store, self.partition)

    def _load_offsets(self) -> None:
        self.changelog_offset = _decode_offset(self.db.get_meta(CHANGELOG_OFFSET_KEY))
        self.source_offset = _decode_offset(self.db.get_meta(SOURCE_OFFSET_KEY))

    def _move_aside(self, error: BaseException) -> Path:
        """Rename the (closed) partition directory aside, still holding its lock, then lock the new, empty one."""
        aside = self._quarantine(self.path, error)
        self._lock.release()  # the lock file moved aside with the directory
        log.warning(
            "Store %r partition %d will be restored fully from %s (its damaged copy is at %s)",
            self.store,
            self.partition,
            self.changelog_topic,
            aside,
        )
        self.path.mkdir(parents=True)
        self._lock.acquire(0.0)
        self.recovered_from_corruption = True
        return aside

    def quarantine(self, error: BaseException) -> Path:
        """Move this damaged partition aside (after a `StoreCorruptedError` met while it was open) and
        start it empty: it stays open and locked, without local state, ready for a full restore from
        its changelog. Returns where the damaged copy went."""
        if self._db is not None:
            database, self._db = self._db, None
            self._note_rocksdb_closing(database)
            try:
                database.close()
            except StateStoreError as failure:
                log.warning("Closing the damaged store %s before moving it aside failed: %s", self.path, failure)
        aside = self._move_aside(error)
        self._db = self._backend(self.path, self.store, self.partition)
        self._load_offsets()
        return aside

    @property
    def evicts(self) -> bool:
        """Whether commits may push entries out of this (bounded) store (see `evictions`)."""
        return self.db.evicts

    def evictions(self, changes: Iterable[tuple[bytes, bytes | None]]) -> list[bytes]:
        """The keys a commit of `changes` must also delete (and tombstone) to keep a bounded store in bounds."""
        return self.db.evictions(changes)

    def get(self, key: bytes) -> bytes | None:
        """The stored value of `key`; raises `StoreCorruptedError` when RocksDB finds the data damaged
        (a plain `StateStoreError` when the machine is short of files, memory or disk)."""
        data = self.db.get(key)
        if data is not None:
            self.metrics.bytes_read += len(data)
        return data

    def holds(self, key: bytes) -> bool:
        """Whether `key` has a stored value."""
        return self.get(key) is not None

    def flush(self) -> None:
        """Make everything written so far durable (restores write without the write-ahead log)."""
        self.db.flush()

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """`get` of every key in one read (RocksDB's multi-get), in order."""
        found = self.db.get_many(keys)
        self.metrics.bytes_read += sum(len(data) for data in found if data is not None)
        return found

    def commit(
        self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int | None, source_offset: int
    ) -> None:
        """Write data and both offsets atomically, then publish the `.checkpoint` file."""
        meta = {SOURCE_OFFSET_KEY: encode_offset(source_offset)}
        if changelog_offset is not None:
            meta[CHANGELOG_OFFSET_KEY] = encode_offset(changelog_offset)
        self.db.write(changes, meta)
        if changelog_offset is not None:
            self.changelog_offset = changelog_offset
        self.source_offset = source_offset
        self.publish_checkpoint()

    def write_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None:
        """One restore batch and the changelog position it reaches, without the write-ahead log: a
        crash loses both together (flushes are atomic), and the next restore replays them."""
        self.db.write(changes, {CHANGELOG_OFFSET_KEY: encode_offset(changelog_offset)}, durable=False)
        self.changelog_offset = changelog_offset

    def ingest_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None:
        """A large restore chunk (strictly ascending keys) as SST files, then the changelog position it
        reaches. Ingested data is durable at once and the position follows it, so a crash in between
        leaves the position behind its data: the next restore replays that chunk again, to the same result."""
        scratch = self.path / ".restore-sst"
        try:
            self.db.ingest_changes(changes, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.db.write((), {CHANGELOG_OFFSET_KEY: encode_offset(changelog_offset)}, durable=False)
        self.changelog_offset = changelog_offset

    def finish_restore(self, changelog_offset: int, source_offset: int | None) -> None:
        """Make the restored data durable, then, only then, the offsets it reaches, then the checkpoint."""
        self.db.flush()
        meta = {CHANGELOG_OFFSET_KEY: encode_offset(changelog_offset)}
        if source_offset is not None:
            meta[SOURCE_OFFSET_KEY] = encode_offset(source_offset)
        self.db.write((), meta)
        self.changelog_offset = changelog_offset
        if source_offset is not None:
            self.source_offset = source_offset
        self.publish_checkpoint()

    def publish_checkpoint(self) -> None:
        checkpoint = Checkpoint(
            changelog_topic=self.changelog_topic,
            partition=self.partition,
            changelog_offset=self.changelog_offset,
            source_topic=self.source_topic,
            source_offset=self.source_offset,
            updated_at=time.time(),
            kept_by_standby=self.as_standby,
        )
        try:
            write_checkpoint(self.path, checkpoint)
        except OSError as error:
            raise StateStoreError(
                f"cannot write the checkpoint file of store {self.store!r} partition {self.partition} in {self.path}: "
                f"{error}. The data and offsets are committed in RocksDB; make the state directory writable (and "
                "check free disk space), then run the worker again."
            ) from error

    def read_checkpoint(self) -> Checkpoint | None:
        return read_checkpoint(self.path)

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every stored (key, value) from `from_key` (or the first key) on, in key order: one range
        operation, timed until the iteration ends or is dropped."""
        entries = self.db.items(from_key)
        metrics = self.metrics
        metrics.ranges += 1
        started = time.perf_counter()
        try:
            for key, value in entries:
                metrics.bytes_read += len(key) + len(value)
                yield key, value
        finally:
            metrics.latency["range"].record(time.perf_counter() - started)

    def rocksdb_counters(self) -> RocksDBCounters | None:
        """RocksDB's figures of this open partition so far, in every database it had (None when it is
        not a RocksDB store, or not open)."""
        database = self._db
        if not isinstance(database, PartitionDatabase):
            return None
        metrics = self.metrics
        return RocksDBCounters(
            metrics.bytes_read, metrics.bytes_written + database.bytes_written, _pending_compaction_bytes(database)
        )

    def _note_rocksdb_closing(self, database: StoreBackend) -> None:
        if isinstance(database, PartitionDatabase):
            self.metrics.rocksdb_closed(database.bytes_written, _pending_compaction_bytes(database))

    def close(self) -> None:
        """Close the database and release the lock (also when closing the database fails). A copy
        that closing finds damaged is moved aside, not raised: everything it held is committed to
        the changelog, and the next open starts empty and restores it fully."""
        database, self._db = self._db, None
        try:
            if database is not None:
                self._note_rocksdb_closing(database)
                if not database.persistent:
                    remove_checkpoint(self.path)
                database.close()
        except StoreCorruptedError as error:
            aside = self._quarantine(self.path, error)
            log.warning(
                "Store %r partition %d was found damaged while closing (%s); moved it to %s, the next "
                "assignment restores it fully from %s",
                self.store,
                self.partition,
                error,
                aside,
                self.changelog_topic,
            )
        finally:
            self._lock.release()

    def wipe(self) -> None:
        """Delete the partition's local state (closed first). The next open starts empty."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def start_fresh(self, lock_timeout: float | None = None) -> None:
        """Delete the (open) partition's state and open it again, empty (`lock_timeout` as `open`)."""
        self.changelog_prefix = None
        self.keys_to_rewrite = set()
        self.wipe()
        self.open(lock_timeout)


def _pending_compaction_bytes(database: PartitionDatabase) -> int:
    estimate = database.rocksdb_property(PENDING_COMPACTION_PROPERTY)
    return int(estimate) if estimate and estimate.isdigit() else 0
