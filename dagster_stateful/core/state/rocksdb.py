"""The RocksDB adapter: the only module of the core that touches rocksdict.

Owns how one state partition is laid out in RocksDB: raw bytes keys and values in the default
column family, and the partition's offsets in a `__meta__` column family, written in the same
WriteBatch as the data so data and offsets can never disagree. Also bulk loading through sorted
SST files (`SortedSstWriter`), used when a store is rebuilt from scratch, locally or by Spark tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from rocksdict import (
    IngestExternalFileOptions,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

META_COLUMN_FAMILY = "__meta__"
DEFAULT_RECORDS_PER_SST = 2_000_000


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


class PartitionDatabase:
    """One open RocksDB database holding one store partition."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fast_writes = WriteOptions()
        # rocksdict's stub declares a method; at run time `disable_wal` is a settable property.
        self._fast_writes.disable_wal = True  # type: ignore[method-assign, assignment]
        self._db = Rdict(str(path), _options(), column_families={META_COLUMN_FAMILY: Options(raw_mode=True)})
        self._meta_handle = self._db.get_column_family_handle(META_COLUMN_FAMILY)
        self._meta = self._db.get_column_family(META_COLUMN_FAMILY)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

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
        if durable:
            self._db.write(batch)
        else:
            self._db.write(batch, self._fast_writes)

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        items = self._db.items(from_key=from_key) if from_key is not None else self._db.items()
        return cast("Iterator[tuple[bytes, bytes]]", items)  # raw mode: keys and values are bytes

    def estimated_keys(self) -> int:
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

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

    def ingest_files(self, files: list[str]) -> None:
        """Ingest finished SST files (moved, not copied); keys must not overlap between files."""
        if files:
            options = IngestExternalFileOptions()
            options.set_move_files(True)
            self._db.ingest_external_file(files, options)

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        # Open column-family handles keep RocksDB's LOCK after close(): drop them first.
        del self._meta
        del self._meta_handle
        self._db.close()


@dataclass(frozen=True)
class SstFile:
    path: str
    records: int


class SortedSstWriter:
    """Writes strictly ascending (key, value) pairs into SST files of at most `records_per_file` records.

    Files are named `<prefix>-<n>.sst` in `directory` and come back from `finish()` in key order,
    ready for `PartitionDatabase.ingest_files`. Used by local bulk loads and by Spark tasks alike.
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
        if self._writer is None or self._current >= self._records_per_file:
            self._close_file()
            self._writer = SstFileWriter(options=Options(raw_mode=True))
            self._writer.open(str(self._directory / f"{self._prefix}-{len(self._files):05d}.sst"))
        self._writer[key] = value
        self._current += 1

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
