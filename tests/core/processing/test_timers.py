"""Timers on a real RocksDB store (no Kafka): scheduling, moving and cancelling a key's timers,
firing by stream time in due order, deletion with the firing (exactly-once) or by the commit after
(at-least-once), a roll-back firing again what its commit never carried, a failed message's
scheduling undone, timers known again after a reopen, readers passing timer records by, and the
configurations refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.core_helpers import opened_partition

from dagster_stateful.core import AppConfig, ConfigurationError, Count, JsonSerde
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.state.decoding import StoreShape
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.query import StoreReader
from dagster_stateful.core.state.serialization import BytesSerde
from dagster_stateful.core.state.transaction import PartitionTransaction


@pytest.fixture
def directory(tmp_path) -> StateDirectory:
    return StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("pending",)))


@pytest.fixture
def store(directory) -> Iterator[StorePartition]:
    yield from opened_partition(directory, "pending")


def transaction(store: StorePartition, exactly_once: bool, committed: int | None = None) -> PartitionTransaction:
    return PartitionTransaction(
        0, {"pending": store}, JsonSerde(), committed, timer_store="pending", exactly_once=exactly_once
    )


def message(txn: PartitionTransaction, key: str, offset: int, timestamp: int, schedule: dict[str, int] | None = None):
    """A message of `key` at `timestamp` scheduling `schedule` (name -> due), accepted."""
    txn.begin_message(key.encode(), offset)
    assert txn.timers is not None
    txn.timers.observe(timestamp)
    state = txn.states["pending"]
    for name, due in (schedule or {}).items():
        state.schedule(name, due)
    txn.accept_message(offset)


def fire_due(txn: PartitionTransaction) -> list[tuple[str, str, int]]:
    """Fire the stream-time timers due, as the worker does; (key, name, due) of each."""
    timers = txn.timers
    assert timers is not None and txn.next_offset is not None
    fired = timers.pop_due(False, timers.stream_time)
    for timer in fired:
        txn.begin_message(timer.key, txn.next_offset - 1)
        timers.fired(timer, txn.next_offset - 1)
        txn.accept_message(txn.next_offset - 1)
    return [(timer.key.decode(), timer.name, timer.due) for timer in fired]


def commit(txn: PartitionTransaction, store: StorePartition) -> None:
    txn.prepare_commit()
    store.commit(((key, value) for key, value, _ in txn.changes("pending")), None, txn.offset_to_commit)
    txn.committed()


def timer_records(store: StorePartition) -> int:
    return sum(1 for key, _ in store.items() if key.startswith(b"\xff\xff\xff\xfftimer"))


def test_timers_fire_in_due_order_once_stream_time_reaches_them_and_a_name_scheduled_again_moves(store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000, {"unpaid": 5000, "remind": 3000})
    message(txn, "b", 1, 1200, {"unpaid": 4000})
    message(txn, "a", 2, 1300, {"remind": 6000})  # moved

    message(txn, "c", 3, 4500)
    assert fire_due(txn) == [("b", "unpaid", 4000)]
    assert txn.states["pending"].timers is txn.timers
    message(txn, "c", 4, 7000)
    assert fire_due(txn) == [("a", "unpaid", 5000), ("a", "remind", 6000)]
    assert fire_due(txn) == [], "each fires once"


def test_cancel_and_timer_read_a_keys_own_timers(store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000, {"unpaid": 5000})
    txn.begin_message(b"a", 1)
    state = txn.states["pending"]

    assert state.timer("unpaid") == 5000 and state.timer("other") is None
    assert state.cancel("unpaid") and not state.cancel("unpaid")
    txn.accept_message(1)
    message(txn, "a", 2, 9000)
    assert fire_due(txn) == []


def test_under_exactly_once_a_timer_is_deleted_with_its_firing(store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000, {"unpaid": 2000})
    commit(txn, store)
    assert timer_records(store) == 2

    message(txn, "b", 1, 2500)
    fire_due(txn)
    commit(txn, store)

    assert timer_records(store) == 0


def test_under_at_least_once_a_timer_is_deleted_by_the_commit_after_the_one_carrying_its_firing(store):
    txn = transaction(store, exactly_once=False)
    message(txn, "a", 0, 1000, {"unpaid": 2000})
    commit(txn, store)
    message(txn, "b", 1, 2500)
    assert fire_due(txn) == [("a", "unpaid", 2000)]

    txn.roll_back()  # the commit never happened: the firing is redone
    message(txn, "b", 1, 2500)
    assert fire_due(txn) == [("a", "unpaid", 2000)]
    commit(txn, store)
    assert timer_records(store) == 2, "kept until its firing is committed"
    assert txn.expiries_due, "the next commit has the deletion to make, even without new messages"

    txn.roll_back()  # after the firing's commit: it does not fire again
    assert fire_due(txn) == []
    commit(txn, store)
    assert timer_records(store) == 0


def test_a_failed_messages_scheduling_is_undone(store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000)
    txn.begin_message(b"a", 1)
    txn.states["pending"].schedule("unpaid", 1500)
    txn.discard_message()
    txn.pass_message(1)

    message(txn, "b", 2, 9000)
    assert fire_due(txn) == []


def test_timers_and_stream_time_are_known_again_after_a_commit_and_a_reopen(directory, store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000, {"unpaid": 8000})
    commit(txn, store)
    store.close()

    reopened = directory.partition("pending", 0)
    reopened.open()
    try:
        txn = transaction(reopened, exactly_once=True, committed=1)
        assert txn.timers is not None and txn.timers.stream_time == 1000
        message(txn, "b", 1, 8000)
        assert fire_due(txn) == [("a", "unpaid", 8000)]
    finally:
        reopened.close()


def test_readers_pass_timer_records_by(directory, store):
    txn = transaction(store, exactly_once=True)
    message(txn, "a", 0, 1000, {"unpaid": 8000})
    txn.begin_message(b"a", 1)
    txn.states["pending"].set("order", {"id": 1})
    txn.accept_message(1)
    commit(txn, store)

    with StoreReader(directory, StoreShape("pending"), BytesSerde(), JsonSerde(), [0]) as reader:
        entries = [(entry.message_key, entry.state_key, entry.value) for entry in reader.items()]

    assert entries == [(b"a", "order", {"id": 1})]
    assert timer_records(store) == 2


def test_a_store_without_on_timer_refuses_to_schedule(store):
    txn = PartitionTransaction(0, {"pending": store}, JsonSerde(), None)
    txn.begin_message(b"a", 0)

    with pytest.raises(ConfigurationError, match="keeps no timers"):
        txn.states["pending"].schedule("unpaid", 1000)


def test_timers_are_refused_where_they_would_be_lost_or_mixed_with_aggregates():
    frame = StreamingDataFrame(["s", "t"], expiring=frozenset({"t"}))
    with pytest.raises(ConfigurationError, match="has a ttl"):
        frame.on_timer(lambda timer, state: None, store="t")
    frame.on_timer(lambda timer, state: None, store="s")
    with pytest.raises(ConfigurationError, match="one on_timer per app"):
        frame.on_timer(lambda timer, state: None, store="s")
    with pytest.raises(ConfigurationError, match="keeps the app's timers"):
        frame.aggregate(Count(), store="s")
