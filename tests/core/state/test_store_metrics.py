"""Per-store metrics on a real local RocksDB (no Kafka): operation counts equal the operations the
steps made, timed calls leave positive latencies, the record cache's hit ratio is hits over reads,
RocksDB's bytes written and read grow with writes and reads, ranges are counted and timed, and a
run's figures sum its partitions per store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from support.core_helpers import opened_partition

from dagster_stateful.core import AppConfig, JsonSerde, Sum
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.latency import LatencyHistogram, bucket_middle, bucket_of
from dagster_stateful.core.state.metrics import SAMPLE_EVERY, TIMED_BURST, RunStoreMetrics, summarize
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction

MESSAGES = TIMED_BURST + SAMPLE_EVERY


@pytest.fixture
def directory(tmp_path) -> StateDirectory:
    return StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("totals", "other")))


@pytest.fixture
def store(directory) -> Iterator[StorePartition]:
    yield from opened_partition(directory, "totals")


def kv_transaction(store: StorePartition) -> PartitionTransaction:
    return PartitionTransaction(0, {"totals": store}, JsonSerde(), committed_offset=None)


def commit(txn: PartitionTransaction, store: StorePartition) -> None:
    store.commit(((key, value) for key, value, _ in txn.changes("totals")), None, txn.offset_to_commit)
    txn.committed()


def test_counts_equal_the_operations_and_sampled_calls_are_timed(store):
    txn = kv_transaction(store)
    state = txn.states["totals"]
    for offset in range(MESSAGES):
        txn.begin_message(f"customer-{offset % 10}".encode(), offset)
        state.set("total", state.get("total", 0) + 1)
        if offset % 3 == 0:
            state.delete("stale")
        assert state.exists("total")
        txn.accept_message(offset)

    metrics = summarize("totals", [store.metrics])
    assert metrics.operation("get").count == 2 * MESSAGES, "one get and one exists per message"
    assert metrics.operation("put").count == MESSAGES
    assert metrics.operation("delete").count == len(range(0, MESSAGES, 3))
    assert metrics.operation("fold").count == metrics.operation("range").count == 0
    first_burst = range(TIMED_BURST)
    timed = {"get": 2 * len(first_burst), "put": len(first_burst), "delete": len(first_burst[::3])}
    for name, samples in timed.items():
        latency = metrics.operation(name).latency
        assert latency.samples == samples, f"the first {TIMED_BURST} messages' {name}s are timed, no other"
        assert 0 < latency.p50_seconds <= latency.p99_seconds < 1 and latency.mean_seconds > 0
    assert type(state) is State, "past the first burst, the view is the plain one"


def test_bursts_of_timed_messages_start_with_the_partition_and_after_each_commit(store):
    txn = kv_transaction(store)
    state = txn.states["totals"]

    def process(offsets: range) -> list[type]:
        classes = []
        for offset in offsets:
            txn.begin_message(b"a", offset)
            classes.append(type(state))
            state.set("total", state.get("total", 0) + 1)
            txn.accept_message(offset)
        return classes

    first = process(range(TIMED_BURST + 10))
    assert all(c is not State and issubclass(c, State) for c in first[:TIMED_BURST])
    assert all(c is State for c in first[TIMED_BURST:])
    commit(txn, store)
    after_commit = process(range(TIMED_BURST + 10, TIMED_BURST + 13))
    assert after_commit[0] is not State and after_commit[1:] == [State, State], (
        f"a commit of {TIMED_BURST + 10} messages times the next one (one per {SAMPLE_EVERY})"
    )
    assert state.get("total") == TIMED_BURST + 13, "timed or not, the operations do the same"


def test_hit_ratio_is_hits_over_reads_for_a_known_sequence(store):
    store.commit([(message_prefix(b"b") + b"total", b"5")], None, 0)
    txn = kv_transaction(store)
    state = txn.states["totals"]
    txn.begin_message(b"a", 1)
    state.get("total")  # miss: read from RocksDB (absent)
    state.set("total", 1)
    state.get("total")  # hit: written
    state.get("total")  # hit
    txn.accept_message(1)
    txn.begin_message(b"b", 2)
    assert state.get("total") == 5  # miss: read from RocksDB (present)
    assert state.get("total") == 5  # hit: remembered
    txn.accept_message(2)

    metrics = summarize("totals", [store.metrics])
    hits, misses = 3, 2
    assert (metrics.cache_hits, metrics.cache_misses) == (hits, misses)
    assert metrics.cache_hit_ratio == pytest.approx(hits / (hits + misses))


def test_folds_are_counted_and_their_reads_in_the_hit_ratio(store):
    frame = StreamingDataFrame(["totals"])
    frame.aggregate(Sum(lambda order: order["amount"]), name="total")
    txn = PartitionTransaction(0, {"totals": store}, JsonSerde(), None, live_stores=frame.live_stores)
    for offset in range(MESSAGES):
        txn.begin_message(f"customer-{offset % 4}".encode(), offset)
        frame.run({"amount": 1}, txn.views)
        txn.accept_message(offset)

    metrics = summarize("totals", [store.metrics])
    assert metrics.operation("fold").count == MESSAGES
    assert metrics.operation("fold").latency.samples >= 3
    assert (metrics.cache_hits, metrics.cache_misses) == (MESSAGES - 4, 4), "each customer's first fold reads RocksDB"


def test_rocksdb_bytes_written_and_read_grow_with_writes_and_reads(store):
    before = store.rocksdb_counters()
    assert before is not None
    changes = [(f"key-{i:04d}".encode(), b"v" * 100) for i in range(1000)]
    store.commit(changes, None, 0)
    written = store.rocksdb_counters()
    assert written is not None
    assert written.bytes_written - before.bytes_written >= sum(len(key) + len(value) for key, value in changes)
    for key, _ in changes[:10]:
        assert store.get(key) is not None
    read = store.rocksdb_counters()
    assert read is not None and read.bytes_read - written.bytes_read >= 10 * 100


def test_a_closed_partition_keeps_what_rocksdb_did_while_it_was_open(directory):
    part = directory.partition("totals", 0)
    part.open()
    part.commit([(b"key", b"value" * 50)], None, 0)
    part.close()
    assert part.metrics.rocksdb is not None and part.metrics.rocksdb.bytes_written >= len(b"key") + 250

    part.open()
    part.close()
    assert part.metrics.rocksdb.bytes_written >= len(b"key") + 250, "a second open adds to the first"


def test_ranges_are_counted_and_timed_until_the_iteration_ends(store):
    store.commit([(f"key-{i}".encode(), b"v") for i in range(50)], None, 0)
    assert sum(1 for _ in store.items()) == 50
    assert next(iter(store.items(b"key-3")))[0] == b"key-3"

    metrics = summarize("totals", [store.metrics])
    assert metrics.operation("range").count == 2
    assert metrics.operation("range").latency.samples == 2 and metrics.operation("range").latency.p99_seconds > 0


def test_a_run_sums_its_partitions_per_store_and_times_commits(directory):
    run = RunStoreMetrics()
    parts = [directory.partition("totals", 0), directory.partition("totals", 1), directory.partition("other", 0)]
    for part in parts:
        part.open()
        txn = PartitionTransaction(part.partition, {part.store: part}, JsonSerde(), None)
        state = txn.states[part.store]
        for offset in range(10):
            txn.begin_message(b"k", offset)
            state.set("n", offset)
            txn.accept_message(offset)
        run.track(part.store, part.partition, part.metrics)
        run.track(part.store, part.partition, part.metrics)  # seen by every commit: counted once
        part.commit(((key, value) for key, value, _ in txn.changes(part.store)), None, 10)
        part.close()
    for seconds in (0.010, 0.020, 0.030, 0.040, 1.0):
        run.commit_latency.record(seconds)

    by_store, totals, commits = run.summary()
    assert sorted(by_store) == ["other", "totals"]
    assert by_store["totals"].partitions == 2 and by_store["totals"].operation("put").count == 20
    assert by_store["other"].operation("put").count == 10 and totals.operation("put").count == 30
    assert by_store["totals"].rocksdb is not None and by_store["totals"].rocksdb.bytes_written > 0
    by_partition = run.partition_metrics()
    assert sorted(by_partition) == [("other", 0), ("totals", 0), ("totals", 1)]
    assert all(metrics.operation("put").count == 10 for metrics in by_partition.values())
    assert commits.samples == 5 and commits.p50_seconds == pytest.approx(0.030, rel=1 / 16)
    assert commits.p99_seconds == pytest.approx(1.0, rel=1 / 16)


def test_the_histogram_reports_percentiles_within_a_sixteenth():
    histogram = LatencyHistogram()
    durations = [i / 1_000_000 for i in range(1, 1001)]  # 1 µs .. 1 ms
    for seconds in durations:
        histogram.record(seconds)
    assert histogram.percentile(0.5) == pytest.approx(durations[499], rel=1 / 16)
    assert histogram.percentile(0.99) == pytest.approx(durations[989], rel=1 / 16)
    assert histogram.summary().mean_seconds == pytest.approx(sum(durations) / len(durations))
    for nanos in (0, 1, 15, 16, 31, 32, 33, 1000, 123_456_789):
        assert abs(bucket_middle(bucket_of(nanos)) - nanos) <= max(1, nanos / 16)


def test_an_expiring_stores_gets_and_sets_are_counted_and_timed(tmp_path):
    config = AppConfig(name="app", source="orders", stores=("seen",), store_ttls={"seen": 1000})
    with contextlib.closing(opened_partition(StateDirectory(tmp_path, config), "seen")) as opened:
        part = next(opened)
        txn = PartitionTransaction(0, {"seen": part}, JsonSerde(), None, ttls={"seen": 1000})
        state = txn.states["seen"]
        for offset in range(MESSAGES):
            txn.begin_message(f"customer-{offset % 10}".encode(), offset)
            state.set("seen", state.get("seen", 0) + 1)
            txn.accept_message(offset)

        metrics = summarize("seen", [part.metrics])
    assert metrics.operation("get").count == metrics.operation("put").count == MESSAGES
    assert (metrics.cache_hits, metrics.cache_misses) == (MESSAGES - 10, 10), "each customer's first get reads RocksDB"
    assert metrics.operation("get").latency.samples == metrics.operation("put").latency.samples == TIMED_BURST
