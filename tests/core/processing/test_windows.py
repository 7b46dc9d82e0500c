"""Windowed aggregations on a real RocksDB store (no Kafka): which windows a timestamp falls in,
what `current()` and `final()` pass on, late messages, retention, a failed message leaving no
trace, the windows known again after a commit and a reopen, and the configurations refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
from support.core_helpers import opened_partition
from support.window_feed import commit, feed

from dagster_stateful.core import AppConfig, Collect, ConfigurationError, Count, JsonSerde, Sum
from dagster_stateful.core.processing.dsl.dataframe import StepFailed, StreamingDataFrame
from dagster_stateful.core.processing.dsl.windows import Emitted, Windows
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.core.state.window_state import STREAM_TIME_KEY, split_window_key

SIZE, GRACE = 1000, 200


def amount(order: dict) -> int:
    return order["amount"]


@pytest.fixture
def directory(tmp_path) -> StateDirectory:
    return StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("windows", "other")))


@pytest.fixture
def store(directory) -> Iterator[StorePartition]:
    yield from opened_partition(directory, "windows")


def frame_of(emit: str = "final", retention: int | None = None, step: int | None = None) -> StreamingDataFrame:
    frame = StreamingDataFrame(["windows"])
    if step is None:
        windows = frame.tumbling_window(SIZE, grace=GRACE, retention=retention, store="windows")
    else:
        windows = frame.hopping_window(SIZE, step, grace=GRACE, retention=retention, store="windows")
    windows.aggregate(Sum(amount))
    return windows.current() if emit == "current" else windows.final()


def transaction(store: StorePartition, frame: StreamingDataFrame, committed: int | None = None) -> PartitionTransaction:
    return PartitionTransaction(0, {"windows": store}, JsonSerde(), committed, live_stores=frame.live_stores)


def results(outputs: list[Any]) -> list[tuple[str, int, Any]]:
    """(customer, window start, value) of every window result passed on, in order."""
    return [(key.decode(), item["start"], item["value"]) for out in outputs for key, item in out]


def stored_windows(store: StorePartition) -> dict[tuple[str, int], Any]:
    return {
        (customer.decode(), start): orjson.loads(value)
        for key, value in store.items()
        if key != STREAM_TIME_KEY
        for start, customer in [split_window_key(key)]
    }


@pytest.mark.parametrize(
    ("size", "step", "timestamp", "starts"),
    [
        (1000, 1000, 0, [0]),
        (1000, 1000, 2999, [2000]),
        (1000, 250, 1000, [250, 500, 750, 1000]),
        (1000, 300, 1000, [300, 600, 900]),
        (1000, 300, 100, [0]),
        (1000, 400, 1999, [1200, 1600]),
    ],
)
def test_a_timestamp_falls_in_the_epoch_aligned_windows_that_cover_it(size, step, timestamp, starts):
    windows = Windows.define(size, step, 0, None, None)

    assert windows.starts(timestamp) == starts
    assert all(start <= timestamp < start + size for start in starts)


def test_final_passes_on_each_window_once_when_stream_time_passes_its_end_plus_grace(store):
    frame = frame_of("final")
    txn = transaction(store, frame)

    outputs = feed(
        frame,
        txn,
        [("a", 100, 1), ("b", 900, 2), ("a", 999, 3), ("a", 1100, 4), ("b", 1199, 5), ("b", 1200, 6), ("a", 2500, 7)],
    )

    assert results(outputs) == [("a", 0, 4), ("b", 0, 2), ("a", 1000, 4), ("b", 1000, 11)]
    assert [len(out) for out in outputs] == [0, 0, 0, 0, 0, 2, 2], "each window closes at end + grace, once"
    assert all(item["end"] == item["start"] + SIZE for out in outputs for _, item in out)


def test_collect_passes_on_each_windows_values_in_the_order_they_came(store):
    frame = StreamingDataFrame(["windows"])
    frame.tumbling_window(SIZE, grace=GRACE, store="windows").aggregate(Collect(amount)).final()
    txn = transaction(store, frame)

    outputs = feed(frame, txn, [("a", 500, 3), ("a", 100, 1), ("b", 900, 2), ("a", 999, 5), ("a", 2300, 7)])

    assert results(outputs) == [("a", 0, [3, 1, 5]), ("b", 0, [2])]


def test_current_passes_on_every_update_and_a_hopping_message_updates_each_of_its_windows(store):
    frame = frame_of("current", step=500)
    txn = transaction(store, frame)

    outputs = feed(frame, txn, [("a", 100, 1), ("a", 700, 2), ("b", 800, 3)])

    assert results(outputs) == [("a", 0, 1), ("a", 0, 3), ("a", 500, 2), ("b", 0, 3), ("b", 500, 3)]


def test_a_message_whose_windows_all_closed_is_late_and_changes_nothing(store):
    frame = frame_of("final", retention=10 * SIZE)
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1), ("a", 1150, 2)])  # stream time 1150: window 0 still open (grace)

    within_grace, closing, late = feed(frame, txn, [("a", 500, 4), ("a", 1300, 16), ("a", 600, 32)], start=2)

    assert within_grace == Emitted() and not within_grace.late, "inside the grace period a message still counts"
    assert results([closing]) == [("a", 0, 5)]
    assert late.late, "past the grace period the message is late"
    commit(txn, store)
    assert stored_windows(store) == {(("a", 0)): 5, ("a", 1000): 18}


def test_windows_past_their_retention_are_deleted_by_the_commit_after_the_one_whose_stream_time_reached_it(store):
    """Only a committed stream time deletes: a deletion decided by messages a crash might leave
    uncommitted could remove a window's committed tally from the compacted changelog."""
    frame = frame_of("current", retention=3 * SIZE)
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1), ("b", 1100, 2), ("a", 2100, 3)])
    commit(txn, store)
    assert set(stored_windows(store)) == {("a", 0), ("b", 1000), ("a", 2000)}

    feed(frame, txn, [("b", 3000, 4)], start=3)  # stream time 3000: window 0 has lived its 3 s
    commit(txn, store)
    assert ("a", 0) in stored_windows(store), "stream time 3000 is committed only now"

    feed(frame, txn, [("b", 3100, 5)], start=4)
    txn.prepare_commit()
    changes = {split_window_key(key): value for key, value, _ in txn.changes("windows") if key != STREAM_TIME_KEY}
    commit(txn, store)

    assert changes[(0, b"a")] is None, "a tombstone for the changelog"
    assert set(stored_windows(store)) == {("b", 1000), ("a", 2000), ("b", 3000)}


def test_a_message_failing_after_the_window_step_leaves_no_trace_and_its_windows_still_close(store):
    frame = frame_of("final")
    failing = [True]

    def downstream(result: dict) -> dict:
        if failing[0]:
            raise ValueError("the sink is down")
        return result

    frame.apply(downstream)
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1), ("b", 500, 2)])

    txn.begin_message(b"c", 2)
    txn.window_list[0].timestamp = 5000
    with pytest.raises(StepFailed):  # it closed both windows, then the step after them failed
        frame.run({"customer": "c", "amount": 4}, txn.views)
    txn.discard_message()

    assert txn.window_list[0].stream_time == 500, "the failed message's stream time is undone"
    failing[0] = False
    outputs = feed(frame, txn, [("c", 1300, 8)], start=3)
    assert results(outputs) == [("a", 0, 1), ("b", 0, 2)], "the windows it closed close again, once"
    commit(txn, store)
    # Windows 0 expired at stream time 1300, which this commit records: the next commit deletes them.
    assert stored_windows(store) == {("a", 0): 1, ("b", 0): 2, ("c", 1000): 8}, "nothing of the failed message kept"


def test_a_reopened_store_knows_its_windows_and_stream_time_and_closes_them(store, directory):
    frame = frame_of("final")
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1), ("b", 900, 2), ("a", 1100, 4)])
    commit(txn, store)
    store.close()
    reopened = directory.partition("windows", 0)
    reopened.open()
    try:
        again = transaction(reopened, frame, committed=3)

        late, closing = feed(frame, again, [("a", 50, 8), ("b", 2300, 16)], start=3)

        assert again.window_list[0].stream_time == 2300
        assert not late.late, "stream time 1100 came back: window 0 is still within grace"
        assert results([closing]) == [("a", 0, 9), ("b", 0, 2), ("a", 1000, 4)]
    finally:
        reopened.close()


def test_the_stream_time_the_last_commit_recorded_judges_messages_and_is_written_back(store):
    """A restore may leave a store's stream time behind the last commit's (compaction removed its
    committed record, and a record of an uncommitted message is never taken): processing goes on
    from the commit's, so messages processed again are judged as the first time."""
    frame = frame_of("final")
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1)])
    commit(txn, store)

    resumed = PartitionTransaction(
        0, {"windows": store}, JsonSerde(), 1, live_stores=frame.live_stores, stream_times={"windows": 1300}
    )
    late, closing = feed(frame, resumed, [("b", 150, 2), ("c", 1400, 4)], start=1)

    assert late.late, "window 0 closed at 1200, before the commit's stream time 1300"
    assert results([closing]) == [], "and it closed then: it is not passed on again"
    assert resumed.window_list[0].stream_time == 1400
    assert resumed.stream_times_to_commit() == {"windows": 1400}
    commit(resumed, store)
    assert stored_windows(store) == {("c", 1000): 4}, "window 0 expired by the stream time the commit began with"


@pytest.mark.parametrize(
    ("declare", "complaint"),
    [
        (lambda f: f.tumbling_window(1000, retention=1100, grace=200, store="windows"), "retention period"),
        (lambda f: f.hopping_window(1000, 2000, store="windows"), "cannot exceed its size"),
        (lambda f: f.tumbling_window(0, store="windows"), "positive size"),
        (lambda f: f.tumbling_window(timedelta(microseconds=1500), store="windows"), "whole milliseconds"),
        (lambda f: f.tumbling_window(1.5, store="windows"), "timedelta or an int"),
    ],
)
def test_impossible_windows_are_refused_with_what_to_change(declare, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        declare(StreamingDataFrame(["windows", "other"]))


def test_a_window_store_is_its_own_and_only_stateless_steps_may_follow_windows():
    frame = StreamingDataFrame(["windows", "other"])
    frame.update(lambda value, state: None, stateful=True, store="other")
    with pytest.raises(ConfigurationError, match="already used by another step"):
        frame.tumbling_window(1000, store="other").aggregate(Count()).final()

    frame.tumbling_window(1000, store="windows").aggregate(Count()).final()
    with pytest.raises(ConfigurationError, match="cannot follow a windowed aggregation"):
        frame.update(lambda value, state: None, stateful=True, store="other")
    with pytest.raises(ConfigurationError, match="cannot follow a windowed aggregation"):
        frame.tumbling_window(1000, store="other")
    frame.apply(lambda result: result["value"])  # stateless: fine
    assert frame.changelog_configs()["windows"]["cleanup.policy"] == "compact,delete"


def test_a_commit_right_after_a_failed_message_records_the_stream_time_of_the_messages_before_it(store):
    """A failed message makes the store forget its windows; the commit that follows must still record
    (and go on from) the stream time its partition reached, or windows already emitted would open again."""
    frame = frame_of("final")
    txn = transaction(store, frame)
    feed(frame, txn, [("a", 100, 1), ("a", 1500, 2)])  # window 0 closed and emitted at stream time 1500
    txn.begin_message(b"a", 2)
    txn.discard_message()
    txn.window_list[0].forget()  # as after a failed message's writes

    assert txn.stream_times_to_commit() == {"windows": 1500}
    commit(txn, store)

    late = feed(frame, txn, [("a", 500, 4)], start=3)
    assert late == [Emitted(late=True)] and late[0].late, "window 0 stays closed after the commit"
    assert txn.window_list[0].stream_time == 1500
