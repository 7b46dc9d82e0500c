"""Expiring key-value state on a real RocksDB store (no Kafka): entries read as missing once stream
time passes their TTL, a set extends them, commits delete and tombstone what a committed stream
time expired (never what only uncommitted messages did), stream time and expiries survive a
reopen, the stream time a commit recorded wins over the store's, a store switched to a TTL keeps
its old entries until they expire, failed messages and roll-backs leave no trace, and the
configurations refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import orjson
import pytest
from support.core_helpers import opened_partition

from dagster_stateful.core import App, AppConfig, ConfigurationError, Count, JsonSerde, Store
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.stream_time import decode_stream_time
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.core.state.ttl import TtlState, split_expiry

TTL = 1000


@pytest.fixture
def directory(tmp_path) -> StateDirectory:
    return StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("seen",), store_ttls={"seen": TTL}))


@pytest.fixture
def store(directory) -> Iterator[StorePartition]:
    yield from opened_partition(directory, "seen")


def transaction(store: StorePartition, committed: int | None = None, ttl: int | None = TTL) -> PartitionTransaction:
    return PartitionTransaction(0, {"seen": store}, JsonSerde(), committed, ttls={} if ttl is None else {"seen": ttl})


def message(txn: PartitionTransaction, key: str, offset: int, timestamp: int) -> TtlState:
    """Begin the message at `offset` as the worker does; the store's state for it."""
    txn.begin_message(key.encode(), offset)
    for state in txn.expiring:
        state.observe(timestamp)
    seen = txn.states["seen"]
    assert isinstance(seen, TtlState)
    return seen


def commit(txn: PartitionTransaction, store: StorePartition) -> dict[bytes, bytes | None]:
    """Commit as the worker does (expiry first); the changes the changelog got."""
    txn.prepare_commit()
    changes = txn.changes("seen")
    store.commit(((key, value) for key, value, _ in changes), None, txn.offset_to_commit)
    txn.committed()
    return {key: value for key, value, _ in changes}


def commit_later(txn: PartitionTransaction, store: StorePartition, offset: int, timestamp: int) -> dict:
    """One more message (of a key nothing else uses) and its commit: the commit that deletes what the
    previous commit's stream time expired. The changes it made."""
    message(txn, "z", offset, timestamp)
    txn.accept_message(offset)
    return commit(txn, store)


def stored(store: StorePartition) -> dict[str, tuple[int | None, object]]:
    """(expiry, value) of every entry in RocksDB, by message key + state key."""
    entries = {}
    for key, data in store.items():
        if key != STREAM_TIME_KEY:
            expiry, payload = split_expiry(data)
            entries[key[4:].decode()] = (expiry, orjson.loads(payload))
    return entries


def key_of(message_key: str, state_key: str) -> bytes:
    return message_prefix(message_key.encode()) + state_key.encode()


def test_an_entry_reads_as_missing_once_stream_time_passes_its_ttl_and_a_set_extends_it(store):
    txn = transaction(store)
    state = message(txn, "a", 0, 100)
    state.set("order-1", {"seen": 1})
    txn.accept_message(0)

    assert message(txn, "a", 1, 100 + TTL - 1).get("order-1") == {"seen": 1}, "one ms before its expiry"
    state.set("order-1", {"seen": 2})  # at stream time 1099: now expires at 2099
    txn.accept_message(1)
    assert message(txn, "b", 2, 2098).get("order-1") is None, "another key's state"
    txn.accept_message(2)
    assert message(txn, "a", 3, 2098).get("order-1") == {"seen": 2}, "the set extended it"
    txn.accept_message(3)
    state = message(txn, "a", 4, 2099)
    assert state.get("order-1") is None and not state.exists("order-1"), "expired at set + ttl"
    assert state.get("order-1", "gone") == "gone"


def test_stream_time_never_goes_back_so_an_older_message_does_not_revive_an_entry(store):
    txn = transaction(store)
    message(txn, "a", 0, 5000).set("order", 1)
    txn.accept_message(0)
    message(txn, "a", 1, 6000)
    txn.accept_message(1)

    assert message(txn, "a", 2, 5500).get("order") is None, "stream time is 6000, past 5000 + ttl"
    assert txn.expiring[0].stream_time == 6000


def test_a_commit_deletes_and_tombstones_exactly_what_expired_and_keeps_stream_time(store):
    txn = transaction(store)
    for offset, (key, timestamp) in enumerate([("a", 0), ("b", 500), ("c", 900)]):
        message(txn, key, offset, timestamp).set("order", offset)
        txn.accept_message(offset)
    assert commit(txn, store)[STREAM_TIME_KEY] is not None
    assert stored(store) == {"aorder": (1000, 0), "border": (1500, 1), "corder": (1900, 2)}

    message(txn, "d", 3, 1500).set("order", 3)
    txn.accept_message(3)
    changes = commit(txn, store)
    assert decode_stream_time(changes[STREAM_TIME_KEY]) == 1500
    assert key_of("a", "order") not in changes, "stream time 1500 was not committed when this commit began"
    assert message(txn, "a", 4, 1500).get("order") is None, "but the entry reads as missing"
    txn.accept_message(4)

    changes = commit_later(txn, store, 5, 1500)

    assert changes[key_of("a", "order")] is None and changes[key_of("b", "order")] is None, "tombstones"
    assert key_of("c", "order") not in changes, "not expired: unchanged"
    assert stored(store) == {"corder": (1900, 2), "dorder": (2500, 3)}


def test_a_reopened_store_knows_its_stream_time_and_expiries(directory, store):
    txn = transaction(store)
    message(txn, "a", 0, 100).set("order", 1)
    txn.accept_message(0)
    message(txn, "b", 1, 800).set("order", 2)
    txn.accept_message(1)
    commit(txn, store)
    store.close()

    store.open()
    reopened = transaction(store, committed=2)
    assert reopened.expiring[0].stream_time == 800
    assert message(reopened, "a", 2, 900).get("order") == 1
    reopened.accept_message(2)
    assert message(reopened, "a", 3, 1100).get("order") is None
    reopened.accept_message(3)
    assert message(reopened, "b", 4, 1100).get("order") == 2
    reopened.accept_message(4)
    commit(reopened, store)
    commit_later(reopened, store, 5, 1100)
    assert stored(store) == {"border": (1800, 2)}


def test_a_store_switched_to_a_ttl_keeps_its_entries_until_they_expire_a_ttl_later(store):
    plain = transaction(store, ttl=None)
    plain.begin_message(b"a", 0)
    plain.states["seen"].set("order", "old")
    plain.accept_message(0)
    commit(plain, store)
    assert split_expiry(store.get(key_of("a", "order")) or b"")[0] is None, "stored without an expiry"

    txn = transaction(store, committed=1)
    assert message(txn, "a", 1, 5000).get("order") == "old", "read as before"
    txn.accept_message(1)
    assert commit(txn, store)[key_of("a", "order")] is not None, "given an expiry, in the changelog too"
    assert stored(store) == {"aorder": (5000 + TTL, "old")}

    message(txn, "b", 2, 5000 + TTL)
    txn.accept_message(2)
    commit(txn, store)
    assert commit_later(txn, store, 3, 5000 + TTL)[key_of("a", "order")] is None
    assert stored(store) == {}


def test_a_failed_messages_set_leaves_no_trace_and_expiry_still_holds(store):
    txn = transaction(store)
    message(txn, "a", 0, 0).set("order", 1)
    txn.accept_message(0)
    commit(txn, store)
    message(txn, "a", 1, 900).set("order", 2)  # would extend it to 1900
    message(txn, "b", 1, 900).set("order", 3)
    txn.discard_message()
    txn.next_offset = 2

    assert message(txn, "a", 2, 999).get("order") == 1
    txn.accept_message(2)
    message(txn, "c", 3, 1000)
    txn.accept_message(3)
    commit(txn, store)
    changes = commit_later(txn, store, 4, 1000)

    assert changes[key_of("a", "order")] is None, "expired on its own set's time"
    assert key_of("b", "order") not in changes
    assert stored(store) == {}


def test_a_roll_back_drops_uncommitted_stream_time_and_sets(store):
    txn = transaction(store)
    message(txn, "a", 0, 100).set("order", 1)
    txn.accept_message(0)
    commit(txn, store)
    message(txn, "b", 1, 5000).set("order", 2)
    txn.accept_message(1)

    txn.roll_back()

    assert txn.expiring[0].stream_time == 100
    assert message(txn, "a", 1, 200).get("order") == 1
    assert message(txn, "b", 1, 200).get("order") is None


def test_ttls_are_positive_durations_of_declared_stores():
    with pytest.raises(ConfigurationError, match="ttl of store 'seen' must be positive"):
        App("app", "orders", stores=[Store("seen", ttl=0)], kafka="127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="whole milliseconds"):
        App("app", "orders", stores=[Store("seen", ttl=timedelta(microseconds=5))], kafka="127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="does not declare"):
        AppConfig(name="app", source="orders", stores=("seen",), store_ttls={"other": 5})
    with pytest.raises(ConfigurationError, match="by its name or as a Store"):
        App("app", "orders", stores=[3], kafka="127.0.0.1:1")  # type: ignore[list-item]

    app = App("app", "orders", stores=["totals", Store("seen", ttl=timedelta(hours=1))], kafka="127.0.0.1:1")
    assert app.stores == ["totals", "seen"] and app.config.store_ttls == {"seen": 3_600_000}


def test_a_changelog_that_deletes_before_the_ttl_is_refused():
    with pytest.raises(ConfigurationError, match="less than the ttl of stores \\['seen'\\]"):
        App(
            "app",
            "orders",
            stores=[Store("seen", ttl=timedelta(days=30))],
            changelog_config={"cleanup.policy": "compact,delete", "retention.ms": str(24 * 3600 * 1000)},
            kafka="127.0.0.1:1",
        )


def test_aggregations_cannot_keep_their_aggregates_in_an_expiring_store():
    frame = StreamingDataFrame(["seen", "counts"], frozenset({"seen"}))
    with pytest.raises(ConfigurationError, match="has a ttl"):
        frame.aggregate(Count(), store="seen")
    with pytest.raises(ConfigurationError, match="has a ttl"):
        frame.tumbling_window(1000, store="seen").aggregate(Count()).final()
    frame.filter(lambda value, state: True, store="seen").aggregate(Count(), store="counts")


def test_the_stream_time_the_last_commit_recorded_wins_over_the_stores(store):
    """A restore may leave a store's stream time behind the last commit's (compaction removed its
    committed record): processing goes on from the commit's, which the next commit writes back."""
    txn = transaction(store)
    message(txn, "a", 0, 100).set("order", 1)
    txn.accept_message(0)
    commit(txn, store)

    resumed = PartitionTransaction(0, {"seen": store}, JsonSerde(), 1, ttls={"seen": TTL}, stream_times={"seen": 1200})

    assert message(resumed, "a", 1, 150).get("order") is None, "expired at 1100, before the commit's 1200"
    assert resumed.expiring[0].stream_time == 1200
    resumed.accept_message(1)
    changes = commit(resumed, store)

    assert decode_stream_time(changes[STREAM_TIME_KEY]) == 1200
    assert changes[key_of("a", "order")] is None, "the last commit's stream time had expired it"
    assert stored(store) == {}
