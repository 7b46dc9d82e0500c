"""Windows of idle partitions closed by the wall clock (`final(advance_when_idle=...)`), on a real
RocksDB store with a clock the test moves (no Kafka): nothing closes before the partition has been
idle that long, then stream time follows the clock from the last record's and each window, session
or sliding window closes once, through the steps after it, with the new stream time committed; a
record coming again resets the idle time; `current()` refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from support.core_helpers import opened_partition
from support.window_feed import feed

from dagster_stateful.core import AppConfig, ConfigurationError, JsonSerde, Sum
from dagster_stateful.core.config import ErrorPolicy
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.idle_windows import IdleWindows, idle_windows
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.core.state.window_state import STREAM_TIME_KEY

IDLE = 1_000


def amount(order: dict) -> int:
    return order["amount"]


@pytest.fixture
def store(tmp_path) -> Iterator[StorePartition]:
    directory = StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("windows",)))
    yield from opened_partition(directory, "windows")


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000

    def __call__(self) -> int:
        return self.now


CLOCK = Clock()


def frame_of(kind: str) -> StreamingDataFrame:
    frame = StreamingDataFrame(["windows"])
    if kind == "tumbling":
        windows = frame.tumbling_window(100, grace=50, store="windows")
    elif kind == "sessions":
        windows = frame.session_window(100, grace=50, store="windows")
    else:
        windows = frame.sliding_window(100, grace=50, store="windows")
    frame = windows.aggregate(Sum(amount)).final(advance_when_idle=IDLE)
    return frame.apply(lambda window: {**window, "sent": True})


def setup(store: StorePartition, kind: str) -> tuple[StreamingDataFrame, PartitionTransaction, IdleWindows, list]:
    frame = frame_of(kind)
    txn = PartitionTransaction(0, {"windows": store}, JsonSerde(), None, live_stores=frame.live_stores)
    sent: list[tuple[str, bytes | None, bytes]] = []
    config = AppConfig(name="app", source="orders", stores=("windows",), output="out", emits_output=True)
    bad_input = BadInputHandler(ErrorPolicy.RAISE, lambda *message: None, "app-dead-letter")
    idle = idle_windows(config, frame, lambda topic, key, value: sent.append((topic, key, value)), bad_input, CLOCK)
    assert idle is not None
    return frame, txn, idle, sent


def results(sent: list[tuple[str, bytes | None, bytes]]) -> list[tuple[str, int, Any]]:
    found = []
    for topic, key, value in sent:
        assert topic == "out"
        window = orjson.loads(value)
        assert window["sent"], "the steps after the window ran"
        found.append(((key or b"").decode(), window["start"], window["value"]))
    return found


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("tumbling", [("a", 1000, 3), ("b", 1000, 4)]),
        ("sessions", [("a", 1000, 3), ("b", 1060, 4)]),
        ("sliding", [("a", 920, 3), ("b", 960, 4), ("a", 1001, 2)]),  # [900, 1000] closed at b's record
    ],
)
def test_an_idle_partitions_stream_time_follows_the_wall_clock_and_closes_each_window_once(store, kind, expected):
    frame, txn, idle, sent = setup(store, kind)
    feed(frame, txn, [("a", 1000, 1), ("a", 1020, 2), ("b", 1060, 4)])
    idle.on_wall_clock([txn])  # sees the partition's last record

    CLOCK.now += IDLE - 1
    assert idle.on_wall_clock([txn]) == 0 and not sent, "not idle long enough yet"

    CLOCK.now += 1  # idle for 1 s: stream time 1060 + 1000, past every window's end plus grace
    assert idle.on_wall_clock([txn]) == len(expected)
    assert sorted(results(sent)) == sorted(expected)
    assert txn.window_list[0].stream_time == 1060 + IDLE

    CLOCK.now += 5_000
    assert idle.on_wall_clock([txn]) == 0 and len(sent) == len(expected), "each window is sent once"
    txn.prepare_commit()
    changes = {key: value for key, value, _ in txn.changes("windows")}
    assert orjson.loads(changes[STREAM_TIME_KEY] or b"null") == 1060 + IDLE, (
        "the stream time the idle advance reached commits"
    )


def test_a_record_after_an_idle_spell_counts_the_idle_time_again_from_itself(store):
    frame, txn, idle, sent = setup(store, "tumbling")
    feed(frame, txn, [("a", 1000, 1)])
    idle.on_wall_clock([txn])
    CLOCK.now += IDLE // 2
    outputs = feed(frame, txn, [("a", 1150, 2)], start=1)
    assert [window["start"] for _, window in outputs[0]] == [1000], "the record closes [1000, 1100) itself"
    CLOCK.now += IDLE // 2
    idle.on_wall_clock([txn])  # sees the new record: idle from now on
    CLOCK.now += IDLE - 1
    assert idle.on_wall_clock([txn]) == 0

    CLOCK.now += 1
    assert idle.on_wall_clock([txn]) == 1
    assert results(sent) == [("a", 1100, 2)]


def test_only_final_windows_advance_when_idle():
    with pytest.raises(TypeError):
        StreamingDataFrame(["w"]).tumbling_window(100).aggregate(Sum(amount)).current(advance_when_idle=IDLE)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="positive duration"):
        StreamingDataFrame(["w"]).tumbling_window(100).aggregate(Sum(amount)).final(advance_when_idle=0)
