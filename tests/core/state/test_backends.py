"""The store interface: every conformance check on every backend the engine ships (RocksDB, memory,
LRU), a backend that breaks the contract caught by them, and how the LRU store picks its evictions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_stateful.core import App, ConfigurationError, Count, Store
from dagster_stateful.core.state.backend import BackendFactory
from dagster_stateful.core.state.conformance import CHECKS, BackendNonconformance, check_backend
from dagster_stateful.core.state.memory import LruDatabase, MemoryDatabase, lru_backend, memory_backend
from dagster_stateful.core.state.rocksdb import PartitionDatabase

BACKENDS: dict[str, BackendFactory] = {
    "rocksdb": PartitionDatabase,
    "memory": memory_backend(),
    "lru": lru_backend(1500),
}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_backend_passes_every_check(backend: str, check: str, tmp_path: Path) -> None:
    CHECKS[check](BACKENDS[backend], tmp_path)


class ForgetfulMetadata(MemoryDatabase):
    """Drops the metadata of every write: offsets would never be kept."""

    def write(self, changes, meta, durable=True) -> None:
        super().write(changes, {}, durable)


class HalfWrites(MemoryDatabase):
    """Applies changes one by one, so a failing iterable leaves half of them."""

    def write(self, changes, meta, durable=True) -> None:
        for key, value in changes:
            super().write([(key, value)], {})
        super().write([], meta)


@pytest.mark.parametrize(
    ("backend", "complaint"),
    [(ForgetfulMetadata, "get_meta should return the latest metadata"), (HalfWrites, "a failed write")],
)
def test_a_backend_that_breaks_the_contract_is_caught(backend, complaint: str, tmp_path: Path) -> None:
    with pytest.raises(BackendNonconformance, match=complaint):
        check_backend(backend, tmp_path)


def test_an_lru_store_evicts_the_least_recently_used_never_a_key_being_written() -> None:
    lru = LruDatabase(3)
    lru.write([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], {})
    assert lru.get(b"a") == b"1"  # a is now the most recently used

    assert lru.evictions([(b"d", b"4")]) == [b"b"]
    assert lru.evictions([(b"d", b"4"), (b"e", b"5")]) == [b"b", b"c"]
    assert lru.evictions([(b"b", b"22"), (b"d", b"4")]) == [b"c"], "b is written: c goes"
    assert lru.evictions([(b"a", None), (b"d", b"4")]) == [], "a delete makes room"
    assert lru.evictions([(b"c", b"33")]) == [], "no new key"
    many = [(key, b"x") for key in (b"d", b"e", b"f", b"g", b"h")]
    assert lru.evictions(many) == [b"b", b"c", b"a", b"d", b"e"], "then the oldest of the commit's own writes"

    lru.write([(b"d", b"4"), (b"e", b"5")], {})  # a restore: trimmed to the bound, oldest first
    assert [key for key, _ in lru.items()] == [b"a", b"d", b"e"]


@pytest.mark.parametrize(
    ("store", "complaint"),
    [
        (Store("s", kind="lru"), "an LRU store needs it"),
        (Store("s", max_entries=10), "max_entries bounds an LRU store"),
        (Store("s", kind="lru", max_entries=0), "at least one entry"),
        (Store("s", kind="disk"), "the kinds are"),
        (Store("s", kind="lru", max_entries=5, ttl=1000), "both expire"),
        (Store("s", kind="memory", backend=PartitionDatabase), "give one"),
    ],
)
def test_impossible_stores_are_refused(store: Store, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        App("app", "orders", stores=[store], kafka="127.0.0.1:1")


def test_windows_cannot_live_in_an_lru_store_and_memory_stores_warn(caplog) -> None:
    app = App("app", "orders", stores=[Store("recent", kind="lru", max_entries=5)], kafka="127.0.0.1:1")
    assert "restores it in full from its changelog" in caplog.text
    with pytest.raises(ConfigurationError, match="LRU store"):
        app.dataframe().tumbling_window(1000).aggregate(Count()).final()
    with pytest.raises(ConfigurationError, match="cannot be read from outside"):
        app.read_state("recent")


def test_an_lru_store_of_aggregates_evicts_at_the_commit_with_tombstones(tmp_path: Path) -> None:
    from dagster_stateful.core import AppConfig, JsonSerde, Sum
    from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
    from dagster_stateful.core.state.directory import StateDirectory
    from dagster_stateful.core.state.keys import message_prefix
    from dagster_stateful.core.state.transaction import PartitionTransaction

    config = AppConfig(name="app", source="orders", stores=("sums",), store_backends={"sums": lru_backend(2)})
    store = StateDirectory(tmp_path, config).partition("sums", 0)
    store.open()
    frame = StreamingDataFrame(["sums"], evicting=frozenset({"sums"})).aggregate(Sum())
    txn = PartitionTransaction(0, {"sums": store}, JsonSerde(), None, live_stores=frame.live_stores)
    for offset, (customer, amount) in enumerate([("a", 1), ("b", 2), ("c", 3), ("a", 4)]):
        txn.begin_message(customer.encode(), offset)
        frame.run(amount, txn.views)
        txn.accept_message(offset)

    txn.prepare_commit()
    changes = {key: value for key, value, _ in txn.changes("sums")}
    store.commit(changes.items(), None, txn.offset_to_commit)
    txn.committed()

    key = {customer: message_prefix(customer.encode()) + b"sum" for customer in "abc"}
    assert changes[key["b"]] is None, "b, the least recently written, is evicted with a tombstone"
    assert changes[key["a"]] == b"5" and changes[key["c"]] == b"3"
    assert dict(store.items()) == {key["a"]: b"5", key["c"]: b"3"}
    txn.begin_message(b"b", 4)
    assert frame.run(10, txn.views) == 10, "an evicted aggregate starts again"
    store.close()
