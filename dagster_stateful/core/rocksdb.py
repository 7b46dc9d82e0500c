"""The RocksDB adapter: the only module of the core that touches rocksdict.

Owns how one state partition is laid out in RocksDB: raw bytes keys and values in the default
column family, and the partition's offsets in a `__meta__` column family, written in the same
WriteBatch as the data so data and offsets can never disagree. Also bulk loading through sorted
SST files, used when a store is rebuilt from scratch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from rocksdict import (
    IngestExternalFileOptions,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

META_COLUMN_FAMILY = "__meta__"


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
        self._fast_writes.disable_wal = True
        self._db = Rdict(str(path), _options(), column_families={META_COLUMN_FAMILY: Options(raw_mode=True)})
        self._meta_handle = self._db.get_column_family_handle(META_COLUMN_FAMILY)
        self._meta = self._db.get_column_family(META_COLUMN_FAMILY)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def write(self, changes: Iterable[tuple[bytes, bytes | None]], meta: Mapping[bytes, bytes],
              durable: bool = True) -> None:
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
        return self._db.items(from_key=from_key) if from_key is not None else self._db.items()

    def estimated_keys(self) -> int:
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

    def ingest_sorted(self, records: Iterable[tuple[bytes, bytes]], scratch_dir: Path,
                      records_per_file: int = 2_000_000) -> int:
        """Bulk-load strictly ascending (key, value) pairs through SST files; returns the count."""
        scratch_dir.mkdir(parents=True, exist_ok=True)
        files: list[str] = []
        writer: SstFileWriter | None = None
        count = 0
        for key, value in records:
            if writer is None or count % records_per_file == 0:
                if writer is not None:
                    writer.finish()
                files.append(str(scratch_dir / f"bulk-{len(files):05d}.sst"))
                writer = SstFileWriter(options=Options(raw_mode=True))
                writer.open(files[-1])
            writer[key] = value
            count += 1
        if writer is not None:
            writer.finish()
        self.ingest_files(files)
        return count

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
