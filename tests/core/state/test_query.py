"""Reading state from outside the stream, on real RocksDB stores (no Kafka): one key's state from
whichever partition holds it, a partition's entries, an expiring store without its expired entries,
a window store's windows by key and start, all while the partitions stay open and locked by their
owner (the reader takes no lock and sees new commits after a refresh), and the reads refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dagster_stateful.core import AppConfig, ConfigurationError, JsonSerde, StrSerde
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.query import StateEntry, StoreReader, StoreShape, WindowEntry
from dagster_stateful.core.state.ttl import with_expiry
from dagster_stateful.core.state.window_state import window_key
from dagster_stateful.errors import StateLockedError

CONFIG = AppConfig(name="app", source="orders", stores=("totals", "seen", "windows"), store_ttls={"seen": 1000})


@pytest.fixture
def directory(tmp_path) -> StateDirectory:
    return StateDirectory(tmp_path, CONFIG)


@pytest.fixture
def owned(directory) -> Iterator[dict[tuple[str, int], StorePartition]]:
    """Partitions 0 and 1 of every store, open (and locked) as a running worker holds them."""
    partitions = {}
    for store in CONFIG.stores:
        for partition in (0, 1):
            partitions[(store, partition)] = part = directory.partition(store, partition)
            part.open()
    yield partitions
    for part in partitions.values():
        part.close()


def json(value: object) -> bytes:
    return JsonSerde().dumps(value)


def put(part: StorePartition, entries: dict[bytes, bytes | None], offset: int = 1) -> None:
    part.commit(entries.items(), None, offset)


def reader(directory: StateDirectory, store: str, **shape) -> StoreReader:
    return StoreReader(directory, StoreShape(store, **shape), StrSerde(), JsonSerde())


def test_a_key_is_read_from_whichever_partition_holds_it_while_its_owner_keeps_the_lock(directory, owned):
    put(owned[("totals", 0)], {message_prefix(b"alice") + b"total": json(10)})
    put(owned[("totals", 1)], {message_prefix(b"bob") + b"total": json(7), message_prefix(b"bob") + b"n": json(2)})

    with reader(directory, "totals") as totals:
        assert totals.get("alice", "total") == 10
        assert totals.get("bob", "total") == 7
        assert totals.get("carol", "total", "none") == "none"
        assert list(totals.items("bob")) == [StateEntry(1, "bob", "n", 2), StateEntry(1, "bob", "total", 7)]
        assert {entry.message_key for entry in totals.items(partitions=[0])} == {"alice"}
        assert [entry.message_key for entry in totals.items(from_key="bob", to_key="bob")] == ["bob", "bob"]
        assert [entry.message_key for entry in totals.items(to_key="bob")] == ["bob", "bob"], "shorter keys first"
        assert [entry.message_key for entry in totals.items(from_key="alice")] == ["alice"]
        assert list(totals.items(from_key="carol")) == []
        with pytest.raises(StateLockedError):
            directory.partition("totals", 0).open(lock_timeout=0)

        put(owned[("totals", 0)], {message_prefix(b"alice") + b"total": json(25)}, offset=2)
        assert totals.get("alice", "total") == 10, "what was committed when the reader opened"
        totals.refresh()
        assert totals.get("alice", "total") == 25


def test_an_expiring_stores_expired_entries_are_left_out(directory, owned):
    part = owned[("seen", 0)]
    put(
        part,
        {
            message_prefix(b"a") + b"o1": with_expiry(1500, json(True)),
            message_prefix(b"a") + b"o2": with_expiry(2500, json(True)),
            STREAM_TIME_KEY: (2000).to_bytes(8, "big", signed=True),
        },
    )

    with reader(directory, "seen", ttl=1000) as seen:
        assert seen.stream_time(0) == 2000
        assert seen.get("a", "o1") is None, "expired at 1500"
        assert [(entry.state_key, entry.expires_at) for entry in seen.items()] == [("o2", 2500)]


def test_a_window_stores_windows_are_read_by_key_and_start(directory, owned):
    part = owned[("windows", 0)]
    windows = {
        window_key(start, message_prefix(key)): json(count)
        for start, key, count in [(0, b"a", 1), (0, b"b", 2), (1000, b"a", 3), (2000, b"b", 4)]
    }
    put(part, {**windows, STREAM_TIME_KEY: json(2100)})

    with reader(directory, "windows", window_size=1000) as store:
        assert list(store.windows("a")) == [WindowEntry(0, "a", 0, 1000, 1), WindowEntry(0, "a", 1000, 2000, 3)]
        assert [(w.message_key, w.start) for w in store.windows(start_from=1000)] == [("a", 1000), ("b", 2000)]
        assert [(w.message_key, w.start) for w in store.windows(start_to=999)] == [("a", 0), ("b", 0)]
        with pytest.raises(ConfigurationError, match="is a window store"):
            store.get("a", "count")


def test_reads_that_cannot_be_answered_are_refused(directory, owned):
    with pytest.raises(ConfigurationError, match="no local state for partitions \\[5\\]"):
        StoreReader(directory, StoreShape("totals"), StrSerde(), JsonSerde(), partitions=[5])
    with reader(directory, "totals") as totals:
        with pytest.raises(ConfigurationError, match="not a window store"):
            list(totals.windows())
        with pytest.raises(ConfigurationError, match="partition 3 is not open"):
            list(totals.items(partitions=[3]))
