"""The RocksDB adapter: the only module of the core that touches rocksdict.

Owns how one state partition is laid out in RocksDB: raw bytes keys and values in the default
column family, and the partition's offsets in a `__meta__` column family, written in the same
WriteBatch as the data so data and offsets can never disagree. Also bulk loading through sorted
SST files (`SortedSstWriter`), used when a store is rebuilt from scratch, locally or by Spark tasks,
and reading a partition from outside the worker that owns it (`SecondaryDatabase`).

Memory is bounded per process, however many store partitions are open: every database shares one
LRU block cache (`BLOCK_CACHE_BYTES`) that also holds index and filter blocks and is charged for
every memtable by one write-buffer manager (`MEMTABLE_BYTES`), which makes the database being
written flush once all memtables together pass that bound. Table files and memtables carry bloom
filters, so reading a key that is absent (every new key) skips those that cannot hold it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    IngestExternalFileOptions,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from dagster_stateful.core.state.rocksdb_files import is_corruption, is_corruption_status, is_shortage
from dagster_stateful.errors import StateStoreError, StoreCorruptedError

META_COLUMN_FAMILY = "__meta__"
DEFAULT_RECORDS_PER_SST = 2_000_000

_MiB: Final = 1024 * 1024
BLOCK_CACHE_BYTES: Final = 64 * _MiB
"""Capacity of the process's one block cache: data, index and filter blocks, and the memtables charged to it."""
MEMTABLE_BYTES: Final = 32 * _MiB
"""All memtables of the process together: past 7/8 of it, the next database written flushes its own. Writes
never wait for that flush, so memtables still being flushed may briefly take the total past it."""
WRITE_BUFFER_BYTES: Final = 16 * _MiB
"""One column family's memtable (Kafka Streams' default): it is flushed when full, even under `MEMTABLE_BYTES`."""
MAX_WRITE_BUFFERS: Final = 3
"""Memtables one column family may hold (one written, the others being flushed) before writes stall."""
BLOOM_BITS_PER_KEY: Final = 10
"""About 1% false positives."""
MEMTABLE_BLOOM_RATIO: Final = 0.1
"""Share of a memtable given to a bloom filter of its whole keys, so that reading a key it does not hold
skips its skip list: a multi-get of new keys cost 0.23 µs a key with it, 0.55 µs without
(bench/bench_memtable_bloom.py)."""
BLOCK_BYTES: Final = 4 * 1024


@dataclass(frozen=True)
class SharedMemory:
    """The block cache and write-buffer manager every database of this process uses."""

    cache: Cache
    write_buffers: WriteBufferManager


_shared: SharedMemory | None = None
_shared_lock = threading.Lock()


def shared_memory() -> SharedMemory:
    """The process's block cache and write-buffer manager, made on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            cache = Cache(BLOCK_CACHE_BYTES)
            # No stall: a writer waiting for memory that only idle databases hold would wait forever.
            manager = WriteBufferManager.new_write_buffer_manager_with_cache(MEMTABLE_BYTES, False, cache)
            _shared = SharedMemory(cache, manager)
        return _shared


def _table_options() -> BlockBasedOptions:
    """Table files with bloom filters, and with index and filters in the shared cache, partitioned so
    that a lookup loads a small piece of them rather than a whole file's (only their top level stays pinned)."""
    table = BlockBasedOptions()
    table.set_block_cache(shared_memory().cache)
    table.set_block_size(BLOCK_BYTES)
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    table.set_cache_index_and_filter_blocks(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(BLOCK_BYTES)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    return table


def _column_family_options() -> Options:
    options = Options(raw_mode=True)
    options.set_block_based_table_factory(_table_options())
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
    options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    options.set_memtable_whole_key_filtering(True)
    return options


def _options() -> Options:
    options = _column_family_options()
    options.set_write_buffer_manager(shared_memory().write_buffers)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # Restores write without the WAL: RocksDB must never flush the offsets without their data.
    options.set_atomic_flush(True)
    return options


class PartitionDatabase:
    """One open RocksDB database holding one store partition (`store`, `partition` name it in errors):
    the engine's default `backend.StoreBackend`."""

    persistent = True
    evicts = False

    def __init__(self, path: Path, store: str | None = None, partition: int | None = None) -> None:
        self.path = path
        self.store = store
        self.partition = partition
        self._fast_writes = WriteOptions()
        # rocksdict's stub declares a method; at run time `disable_wal` is a settable property.
        self._fast_writes.disable_wal = True  # type: ignore[method-assign, assignment]
        try:
            self._db = Rdict(str(path), _options(), column_families={META_COLUMN_FAMILY: _column_family_options()})
        except Exception as error:
            raise self._open_error(error) from error
        self._meta_handle = self._db.get_column_family_handle(META_COLUMN_FAMILY)
        self._meta = self._db.get_column_family(META_COLUMN_FAMILY)
        self.bytes_written = 0
        """Bytes of the write batches since the database opened: RocksDB's `rocksdb.bytes.written`, kept here."""

    @property
    def _where(self) -> str:
        which = f"store {self.store!r} partition {self.partition} " if self.store is not None else ""
        return f"{which}at {self.path}"

    def _open_error(self, error: Exception) -> StateStoreError:
        if is_corruption(self.path, error):
            return StoreCorruptedError(
                f"the RocksDB state {self._where} is corrupted ({error}); it must be moved aside and restored "
                "from its changelog",
                str(self.path),
                self.store,
                self.partition,
            )
        return StateStoreError(
            f"cannot open the RocksDB state {self._where}: {error}. This is not corruption, so nothing was moved "
            "or deleted. Check free disk space, the open-files limit (ulimit -n) and the directory's permissions, "
            "then run the worker again."
        )

    def _read_error(self, error: Exception) -> StateStoreError:
        if is_shortage(error):
            return StateStoreError(
                f"cannot read the RocksDB state {self._where} now: {error}. This is not corruption, so nothing needs "
                "moving; raise the open-files limit (ulimit -n) or free memory or disk, then run the worker again."
            )
        return self._corrupted("reading", error)

    def _write_error(self, doing: str, error: Exception) -> StateStoreError:
        """Corruption RocksDB met (often in a background compaction, which then refuses every write)
        is a damaged store; anything else (a full disk, a read-only directory) is the machine's."""
        if is_corruption_status(error):
            return self._corrupted(doing, error)
        return StateStoreError(
            f"{doing} the RocksDB state {self._where} failed: {error}. This is not corruption, so nothing was moved; "
            "what was not written is in the changelog and is restored from it. Check free disk space and that the "
            "directory is writable, then run the worker again."
        )

    def _corrupted(self, doing: str, error: Exception) -> StoreCorruptedError:
        return StoreCorruptedError(
            f"{doing} the RocksDB state {self._where} failed: {error}. The local copy is damaged or unreadable: move "
            "it aside and restore it from the changelog (StorePartition.quarantine, or stop the worker and run the "
            "restore job with from_scratch=true); if the disk itself fails, replace it first.",
            str(self.path),
            self.store,
            self.partition,
        )

    def get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)
        except Exception as error:
            raise self._read_error(error) from error

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        try:
            found: list[bytes | None] = self._db.get(keys)  # type: ignore[arg-type, assignment]  # a multi-get
            return found
        except Exception as error:
            raise self._read_error(error) from error

    def get_meta(self, key: bytes) -> bytes | None:
        try:
            return self._meta.get(key)
        except Exception as error:
            raise self._read_error(error) from error

    def write(
        self, changes: Iterable[tuple[bytes, bytes | None]], meta: Mapping[bytes, bytes], durable: bool = True
    ) -> None:
        """Apply puts (value) and deletes (None) and the metadata in one atomic WriteBatch.

        `durable=False` skips the write-ahead log (restores: a crash there replays from the
        changelog anyway); call `flush()` when done.
        """
        batch = WriteBatch(raw_mode=True)
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for key, value in meta.items():
            batch.put(key, value, self._meta_handle)
        size = batch.size_in_bytes()  # a written batch is consumed
        try:
            if durable:
                self._db.write(batch)
            else:
                self._db.write(batch, self._fast_writes)
        except Exception as error:
            raise self._write_error("writing (nothing of this write was applied) to", error) from error
        self.bytes_written += size

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) from `from_key` (or the first key) on, in key order. Raises
        `StoreCorruptedError` when RocksDB stops at a damaged block, rather than ending early."""
        try:
            yield from _scan(self._db, from_key)
        except Exception as error:
            raise self._read_error(error) from error

    def estimated_keys(self) -> int:
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

    def evictions(self, changes: Iterable[tuple[bytes, bytes | None]]) -> list[bytes]:
        """Nothing: a RocksDB store keeps every key until it is deleted."""
        return []

    def rocksdb_property(self, name: str, meta: bool = False) -> str | None:
        """A RocksDB property of the data (`meta`: of the offsets' column family), e.g.
        "rocksdb.cur-size-all-mem-tables" or "rocksdb.block-cache-usage"; None when RocksDB has no such property."""
        return (self._meta if meta else self._db).property_value(name)

    def ingest_sorted(
        self, records: Iterable[tuple[bytes, bytes]], scratch_dir: Path, records_per_file: int = DEFAULT_RECORDS_PER_SST
    ) -> int:
        """Bulk-load strictly ascending (key, value) pairs through SST files; returns the count."""
        writer = SortedSstWriter(scratch_dir, "bulk", records_per_file)
        for key, value in records:
            writer.put(key, value)
        files = writer.finish()
        self.ingest_files([file.path for file in files])
        return sum(file.records for file in files)

    def ingest_changes(self, changes: Iterable[tuple[bytes, bytes | None]], scratch_dir: Path) -> None:
        """Bulk-apply strictly ascending puts (value) and deletes (None) through SST files, which
        take precedence over everything already in the database."""
        writer = SortedSstWriter(scratch_dir, "changes")
        writer.write_changes(changes)
        self.ingest_files([file.path for file in writer.finish()])

    def ingest_files(self, files: list[str]) -> None:
        """Ingest finished SST files (moved, not copied); keys must not overlap between files."""
        if files:
            options = IngestExternalFileOptions()
            options.set_move_files(True)
            try:
                self._db.ingest_external_file(files, options)
            except Exception as error:
                raise self._write_error("ingesting SST files into", error) from error

    def flush(self) -> None:
        """Write both column families' memtables to SST files: the data first, then the offsets, so a
        crash in between leaves offsets behind their data (replayed again), never ahead of it."""
        try:
            self._db.flush()
            self._meta.flush()
        except Exception as error:
            raise self._write_error("flushing", error) from error

    def close(self) -> None:
        """Close the database; its handles are dropped even when RocksDB reports a failure, which is
        raised afterwards (writes since the last flush are in the write-ahead log or the changelog)."""
        # Open column-family handles keep RocksDB's LOCK after close(): drop them first.
        del self._meta
        del self._meta_handle
        try:
            self._db.close()
        except Exception as error:
            raise self._write_error("closing", error) from error


class SecondaryDatabase:
    """A read-only view of a partition's RocksDB that another process (a running worker) may be
    writing: a RocksDB secondary instance, which takes no lock and sees what the primary has
    written (write-ahead log included) when opened and after each `catch_up()`. Its own few files
    (an info log) go to `scratch`."""

    def __init__(self, path: Path, scratch: Path, store: str, partition: int) -> None:
        self.path = path
        options = Options(raw_mode=True)
        options.set_max_open_files(-1)  # a secondary instance keeps every table file open
        try:
            self._db = Rdict(
                str(path),
                options,
                column_families={META_COLUMN_FAMILY: Options(raw_mode=True)},
                access_type=AccessType.secondary(str(scratch)),
            )
        except Exception as error:
            raise StateStoreError(
                f"cannot read the RocksDB state of store {store!r} partition {partition} at {path}: {error}. Nothing "
                "was changed; check that the directory is readable and holds a store (a worker or restore made it)."
            ) from error

    def catch_up(self) -> None:
        """See what the primary has written since."""
        self._db.try_catch_up_with_primary()

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) from `from_key` (or the first key) on, in key order."""
        return _scan(self._db, from_key)

    def close(self) -> None:
        self._db.close()


def _scan(database: Rdict, from_key: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of `database` from `from_key` (or the first key) on, in key order; raises
    RocksDB's status when the iteration stopped at a damaged block rather than at the end."""
    iterator = database.iter()
    if from_key is None:
        iterator.seek_to_first()
    else:
        iterator.seek(from_key)
    while iterator.valid():
        yield iterator.key(), iterator.value()
        iterator.next()
    iterator.status()


def _sst_options() -> Options:
    """The databases' table format, so that ingested files have bloom filters too."""
    options = Options(raw_mode=True)
    options.set_block_based_table_factory(_table_options())
    return options


@dataclass(frozen=True)
class SstFile:
    path: str
    records: int


class SortedSstWriter:
    """Writes strictly ascending keys (puts, and deletes that shadow older data once ingested) into
    SST files of at most `records_per_file` records.

    Files are named `<prefix>-<n>.sst` in `directory` and come back from `finish()` in key order,
    ready for `PartitionDatabase.ingest_files`. Used by local bulk loads, full restores from the
    changelog and Spark tasks alike.
    """

    def __init__(self, directory: str | Path, prefix: str, records_per_file: int = DEFAULT_RECORDS_PER_SST) -> None:
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._prefix = prefix
        self._records_per_file = records_per_file
        self._writer: SstFileWriter | None = None
        self._current = 0
        self._files: list[SstFile] = []

    def put(self, key: bytes, value: bytes) -> None:
        self._file()[key] = value
        self._current += 1

    def put_many(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """`put` of each (key, value) pair, with no Python loop per pair (a snapshot's batches)."""
        start, total = 0, len(keys)
        while start < total:
            writer = self._file()
            end = min(total, start + self._records_per_file - self._current)
            deque(map(writer.__setitem__, keys[start:end], values[start:end]), maxlen=0)
            self._current += end - start
            start = end

    def delete(self, key: bytes) -> None:
        del self._file()[key]
        self._current += 1

    def write_changes(self, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Strictly ascending puts (value) and deletes (None)."""
        for key, value in changes:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def _file(self) -> SstFileWriter:
        if self._writer is None or self._current >= self._records_per_file:
            self._close_file()
            self._writer = SstFileWriter(options=_sst_options())
            self._writer.open(str(self._directory / f"{self._prefix}-{len(self._files):05d}.sst"))
        return self._writer

    def finish(self) -> list[SstFile]:
        """Close the last file; returns every file written, in key order."""
        self._close_file()
        return list(self._files)

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.finish()
        path = str(self._directory / f"{self._prefix}-{len(self._files):05d}.sst")
        self._files.append(SstFile(path, self._current))
        self._writer, self._current = None, 0
