"""Per-store metrics of a worker run, like Kafka Streams' state store metrics.

Owns what is counted while a store partition is open (`PartitionMetrics`: the state operations the
steps make, with those of some messages timed, the reads its record cache could not answer,
the bytes RocksDB read and wrote), what a run sums up per store over the partitions it held
(`StoreMetrics`) and how it gathers them (`RunStoreMetrics`, with its commits' durations).

The operations: `get` (`State.get` / `exists`), `put` (`State.set`), `delete` (`State.delete`),
`fold` (an aggregation's read-modify-write of one aggregate, windowed or not) and `range` (an
iteration over the partition, timed from its start to its end, as Kafka Streams times its range
iterators). Counts are exact. Timing is sampled in bursts, so that the other messages pay nothing
for it, not even a check: when a partition starts processing and after each of its commits, the
operations of its next messages are timed, one message for every `SAMPLE_EVERY` the commit covered
(at least one, at most `TIMED_BURST`); a timed call's duration includes about 0.2 µs of timing. The
record cache's hit ratio is the share of gets and folds answered without reading RocksDB. RocksDB's
bytes are those its statistics would count (`rocksdb.bytes.read`: the values point reads found, and
`rocksdb.db.iter.bytes.read`: the keys and values iterated; `rocksdb.bytes.written`: the write
batches' size; all before compression), counted by the engine instead, because RocksDB's statistics
cost about 0.1 µs per read; SST files ingested by restores are not counted. The pending compaction
bytes are RocksDB's `rocksdb.estimate-pending-compaction-bytes` when the partition closed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from dagster_stateful.core.state.latency import Latency, LatencyHistogram, merged

SAMPLE_EVERY: Final = 128
"""At most one message in this many has its state operations timed."""
TIMED_BURST: Final = 128
"""The most messages timed in a row: when a partition starts, and after a commit of many messages."""
OPERATIONS: Final = ("get", "put", "delete", "fold", "range")
ALL_STORES: Final = "*"
"""The store name of a run's totals over every store."""

PENDING_COMPACTION_PROPERTY: Final = "rocksdb.estimate-pending-compaction-bytes"


@dataclass(frozen=True)
class RocksDBCounters:
    """RocksDB's figures of one or more store partitions."""

    bytes_read: int = 0
    bytes_written: int = 0
    pending_compaction_bytes: int = 0
    """An estimate, at the moment it was read (not cumulative)."""

    def plus(self, other: RocksDBCounters) -> RocksDBCounters:
        """Both partitions' figures together."""
        return RocksDBCounters(
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.pending_compaction_bytes + other.pending_compaction_bytes,
        )


class PartitionMetrics:
    """The counters of one store partition, updated by its state views on every call."""

    __slots__ = (
        "bytes_read",
        "bytes_written",
        "deletes",
        "folds",
        "gets",
        "latency",
        "misses",
        "pending_compaction_bytes",
        "puts",
        "ranges",
        "timed_messages_left",
    )

    def __init__(self) -> None:
        self.gets = self.puts = self.deletes = self.folds = self.ranges = 0
        self.misses = 0
        """Gets and folds that read RocksDB because the record cache did not hold the key."""
        self.latency = {operation: LatencyHistogram() for operation in OPERATIONS}
        self.bytes_read = 0
        """Bytes of the values point reads found and of the keys and values ranges went over."""
        self.bytes_written = 0
        """Bytes of the write batches of the partition's databases that closed."""
        self.pending_compaction_bytes: int | None = None
        """RocksDB's estimate when its database last closed (None: none closed, or not a RocksDB store)."""
        self.timed_messages_left = 0
        """Messages of the current burst still to be timed (see `view.timed_variant`)."""

    def count(self, operation: str) -> int:
        return int(getattr(self, f"{operation}s"))

    def rocksdb_closed(self, bytes_written: int, pending_compaction_bytes: int) -> None:
        """The partition's RocksDB database closed, having written `bytes_written`."""
        self.bytes_written += bytes_written
        self.pending_compaction_bytes = pending_compaction_bytes

    @property
    def rocksdb(self) -> RocksDBCounters | None:
        """RocksDB's figures up to the last close (None: no RocksDB database of the partition closed)."""
        if self.pending_compaction_bytes is None:
            return None
        return RocksDBCounters(self.bytes_read, self.bytes_written, self.pending_compaction_bytes)


@dataclass(frozen=True)
class OperationMetrics:
    count: int = 0
    latency: Latency = field(default_factory=Latency)
    """Of the timed calls only (see `SAMPLE_EVERY`, `TIMED_BURST`)."""


@dataclass(frozen=True)
class StoreMetrics:
    """One store's metrics over the partitions a run held."""

    store: str
    partitions: int = 0
    operations: dict[str, OperationMetrics] = field(default_factory=dict)
    """By operation: "get", "put", "delete", "fold", "range"."""
    cache_hits: int = 0
    cache_misses: int = 0
    rocksdb: RocksDBCounters | None = None
    """None when no partition of the store was a RocksDB one that closed in the run."""

    @property
    def cache_hit_ratio(self) -> float | None:
        """Share of gets and folds the record cache answered; None without any."""
        reads = self.cache_hits + self.cache_misses
        return self.cache_hits / reads if reads else None

    def operation(self, name: str) -> OperationMetrics:
        return self.operations.get(name, OperationMetrics())


def summarize(store: str, partitions: Iterable[PartitionMetrics]) -> StoreMetrics:
    """`store`'s metrics over the counters of its partitions."""
    partitions = list(partitions)
    operations = {
        name: OperationMetrics(
            sum(p.count(name) for p in partitions), merged(p.latency[name] for p in partitions).summary()
        )
        for name in OPERATIONS
    }
    reads = operations["get"].count + operations["fold"].count
    misses = sum(p.misses for p in partitions)
    rocksdb: RocksDBCounters | None = None
    for counters in (p.rocksdb for p in partitions):
        if counters is not None:
            rocksdb = counters if rocksdb is None else rocksdb.plus(counters)
    return StoreMetrics(store, len(partitions), operations, max(0, reads - misses), misses, rocksdb)


class RunStoreMetrics:
    """What one worker run gathers: the counters of every store partition its commits saw, and how
    long each commit took."""

    def __init__(self) -> None:
        self._partitions: dict[int, tuple[str, int, PartitionMetrics]] = {}
        """By the counters' id (held here, so no other object takes that id)."""
        self.commit_latency = LatencyHistogram()

    def track(self, store: str, partition: int, metrics: PartitionMetrics) -> None:
        self._partitions.setdefault(id(metrics), (store, partition, metrics))

    def store_metrics(self) -> dict[str, StoreMetrics]:
        by_store: dict[str, list[PartitionMetrics]] = {}
        for store, _, metrics in self._partitions.values():
            by_store.setdefault(store, []).append(metrics)
        return {store: summarize(store, partitions) for store, partitions in sorted(by_store.items())}

    def partition_metrics(self) -> dict[tuple[str, int], StoreMetrics]:
        """Per (store, partition): its metrics in the run (a partition held twice, its two spells together)."""
        by_partition: dict[tuple[str, int], list[PartitionMetrics]] = {}
        for store, partition, metrics in self._partitions.values():
            by_partition.setdefault((store, partition), []).append(metrics)
        return {key: summarize(key[0], spells) for key, spells in sorted(by_partition.items())}

    def summary(self) -> tuple[dict[str, StoreMetrics], StoreMetrics, Latency]:
        """(metrics per store, totals over every store, commit durations): take it once the run's
        stores are closed (RocksDB's figures are taken as they close)."""
        totals = summarize(ALL_STORES, (metrics for _, _, metrics in self._partitions.values()))
        return self.store_metrics(), totals, self.commit_latency.summary()
