"""RocksDB memory stays bounded however many store partitions are open, and table files have bloom filters.

Checked through RocksDB's own properties on real local databases, no Kafka.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_stateful.core.state.rocksdb import (
    BLOCK_CACHE_BYTES,
    MEMTABLE_BYTES,
    WRITE_BUFFER_BYTES,
    PartitionDatabase,
)

VALUE = b"v" * 1024
BATCH_RECORDS = 256


@pytest.fixture
def open_databases(tmp_path: Path) -> Iterator[list[PartitionDatabase]]:
    """Four partitions of one store, closed after the test."""
    databases = [PartitionDatabase(tmp_path / str(partition), "totals", partition) for partition in range(4)]
    yield databases
    for database in databases:
        database.close()


def int_property(database: PartitionDatabase, name: str, meta: bool = False) -> int:
    value = database.rocksdb_property(name, meta)
    assert value is not None, f"RocksDB has no property {name}"
    return int(value)


def table_properties(database: PartitionDatabase) -> dict[str, str]:
    """RocksDB's aggregated table properties of the database's files, as {name: value}."""
    text = database.rocksdb_property("rocksdb.aggregated-table-properties") or ""
    pairs = (item.partition("=") for item in text.split("; ") if "=" in item)
    return {name: value for name, _, value in pairs}


def write_round(database: PartitionDatabase, round_number: int) -> None:
    """One commit-sized batch of `BATCH_RECORDS` values of 1 KiB under new keys."""
    changes = ((b"key-%04d-%04d" % (round_number, i), VALUE) for i in range(BATCH_RECORDS))
    database.write(changes, {b"source_offset": b"%d" % round_number})


def test_every_store_partition_uses_one_block_cache_of_the_configured_size(open_databases):
    first, second = open_databases[:2]
    for database in open_databases:
        assert int_property(database, "rocksdb.block-cache-capacity") == BLOCK_CACHE_BYTES
        assert int_property(database, "rocksdb.block-cache-capacity", meta=True) == BLOCK_CACHE_BYTES

    before = int_property(first, "rocksdb.block-cache-usage")
    for round_number in range(8):  # 2 MiB, short of any flush
        write_round(second, round_number)
    # The memtable written in the second database is charged to the cache the first one sees.
    assert int_property(first, "rocksdb.block-cache-usage") >= before + 1024 * 1024


def test_memtables_of_all_partitions_together_stay_under_the_bound(open_databases):
    rounds = 52  # 13 MiB per database (under its own write buffer), 52 MiB in all
    assert rounds * BATCH_RECORDS * len(VALUE) < WRITE_BUFFER_BYTES
    assert rounds * BATCH_RECORDS * len(VALUE) * len(open_databases) > MEMTABLE_BYTES * 3 // 2
    largest = 0
    for round_number in range(rounds):
        for database in open_databases:
            write_round(database, round_number)
        active = sum(int_property(database, "rocksdb.cur-size-active-mem-table") for database in open_databases)
        largest = max(largest, active)
    assert largest <= MEMTABLE_BYTES
    for database in open_databases:
        assert database.get(b"key-0000-0000") == VALUE
        assert database.get(b"key-%04d-%04d" % (rounds - 1, BATCH_RECORDS - 1)) == VALUE


def test_flushed_files_have_bloom_filters(open_databases):
    database = open_databases[0]
    for round_number in range(4):
        write_round(database, round_number)
    database.flush()
    properties = table_properties(database)
    assert int(properties["# entries for filter"]) == 4 * BATCH_RECORDS
    assert int(properties["filter block size"]) > 0


def test_ingested_sst_files_have_bloom_filters_and_read_back(open_databases, tmp_path):
    database = open_databases[0]
    records = [(b"key-%06d" % i, b"%d" % i) for i in range(10_000)]
    assert database.ingest_sorted(iter(records), tmp_path / "scratch", records_per_file=4_000) == len(records)
    properties = table_properties(database)
    assert int(properties["# entries for filter"]) == len(records)
    assert int(properties["filter block size"]) > 0
    assert database.get(b"key-009999") == b"9999"
    assert database.get(b"key-010000") is None
