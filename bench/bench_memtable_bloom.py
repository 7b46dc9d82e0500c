"""What a memtable bloom filter saves when a worker reads keys its store does not hold yet.

With many distinct keys most keys a batch touches are new: the worker's multi-get of the keys its
record cache misses finds nothing, after searching each memtable's skip list. A bloom filter of
the memtable's whole keys (`MEMTABLE_BLOOM_RATIO` of it) answers most such reads without the
search. This script opens a store partition as the engine does, with and without that filter,
and measures, alternating:

1. batches of --batch new keys, each multi-got (every key missing) and then written, as the
   columnar worker does with 1M keys: the microseconds per missed key, over --batches batches;
2. one multi-get of 100,000 missing keys against the memtable those batches filled.

    .venv/bin/python bench/bench_memtable_bloom.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench_restore import print_machine

from dagster_stateful.core.state import rocksdb
from dagster_stateful.core.state.rocksdb import MEMTABLE_BLOOM_RATIO, WRITE_BUFFER_BYTES, PartitionDatabase

LARGE_READ = 100_000


def store_key(index: int) -> bytes:
    return b"\x00\x00customer-%09d\x00total" % index


@contextmanager
def database(bloom: bool) -> Iterator[PartitionDatabase]:
    """A store partition with the engine's options, or with them but no memtable bloom filter."""
    engine_options = rocksdb._column_family_options

    def without_bloom() -> rocksdb.Options:
        options = engine_options()
        options.set_memtable_prefix_bloom_ratio(0.0)
        options.set_memtable_whole_key_filtering(False)
        return options

    with tempfile.TemporaryDirectory(prefix="bench-memtable-bloom-") as directory:
        if not bloom:
            rocksdb._column_family_options = without_bloom
        try:
            db = PartitionDatabase(Path(directory) / "db")
        finally:
            rocksdb._column_family_options = engine_options
        try:
            yield db
        finally:
            db.close()


def measure(bloom: bool, batches: int, batch: int) -> tuple[float, float]:
    """Microseconds per missed key: over the growing batches, and in one large read after them."""
    with database(bloom) as db:
        reading = 0.0
        for number in range(batches):
            keys = [store_key(number * batch + i) for i in range(batch)]
            began = time.perf_counter()
            found = db.get_many(keys)
            reading += time.perf_counter() - began
            assert not any(found), "a new key was found"
            db.write(((key, b"123") for key in keys), {})
        keys = [store_key(batches * batch + i) for i in range(LARGE_READ)]
        began = time.perf_counter()
        db.get_many(keys)
        large = time.perf_counter() - began
    return reading / (batches * batch) * 1e6, large / LARGE_READ * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1_700, help="new keys per batch (1M keys' worker: about 1,700)")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    print_machine()
    print(
        f"settings: {arguments.batches} batches of {arguments.batch:,} new keys, then one read of {LARGE_READ:,}; "
        f"memtable {WRITE_BUFFER_BYTES >> 20} MiB, bloom ratio {MEMTABLE_BLOOM_RATIO}; {arguments.rounds} rounds"
    )
    for round_ in range(arguments.rounds):
        for bloom in (False, True):
            per_key, large = measure(bloom, arguments.batches, arguments.batch)
            label = "memtable bloom" if bloom else "no memtable bloom"
            print(f"round {round_ + 1} {label:<18}: {per_key:.2f} µs a missed key in batches, {large:.2f} µs in one")


if __name__ == "__main__":
    main()
