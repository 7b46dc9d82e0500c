"""The columnar path against the per-message path, on real RocksDB (no Kafka).

Random consumed batches of good and bad messages go through both processors, under each error
policy and each columnar aggregator, plain and in tumbling and hopping windows (`final()`) with
out-of-order and late messages: both must keep the same aggregates (and windows and stream times)
tagged with the same offsets, reach the same offset on every partition, send the same closed
windows, and skip, dead-letter or stop at the same messages. A failure names its seed;
`FAULT_SEED=<seed>` replays it. Also: the columnar path folds whole runs where it can, merges into
aggregates a previous commit left in RocksDB, leaves the messages of partitions it does not hold
alone, and a closed window that a later step refuses goes to the error policy as it would message
by message.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Message

from dagster_stateful.core import AppConfig, Count, JsonSerde, Max, Mean, Min, Sum
from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.batch import BatchProcessor
from dagster_stateful.core.processing.paths.columns import decode_field
from dagster_stateful.core.processing.paths.vectorized import VectorizedBatchProcessor
from dagster_stateful.core.processing.restores.state_updater import Restorations
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import ProcessingError

SEED = int(os.environ.get("FAULT_SEED") or random.randrange(2**32))
SOURCE = "orders"
HELD = (0, 1)
"""The partitions the processors hold; messages of partition 2 are someone else's."""
WINDOWINGS: dict[str, tuple[int, int, int] | None] = {
    "plain": None,
    "tumbling": (1000, 1000, 200),
    "hopping": (1000, 250, 200),
}
"""(size, step, grace) in ms of the windowed aggregations; None: a plain one."""

AGGREGATORS = {
    "count": Count,
    "sum": lambda: Sum("amount"),
    "min": lambda: Min("amount"),
    "max": lambda: Max("amount"),
    "mean": lambda: Mean("amount"),
}

BAD_VALUES: list[bytes | None] = [
    b"not json",
    b"",
    b"   ",
    b'{"customer": "c1"}',
    b'{"amount": null}',
    b'{"amount": "7"}',
    b'{"amount": true}',
    b'{"amount": [1]}',
    b'{"amount": {"x": 1}}',
    b"[1, 2]",
    b"5",
    b'{"amount": 1, "note": "\xff"}',
    b'{"amount": 1, "note": NaN}',
    b'\xef\xbb\xbf{"amount": 1}',
    b'{"amount": 2} {"amount": 3}',
    b'{"amount": 2}\n{"amount": 3}',
    None,
]
"""Values each aggregator of a field refuses (a count refuses those that are not JSON)."""
ODD_GOOD_VALUES = [
    b'{\n  "amount": 4\n}',
    b'{"amount": 2.75}',
    b'{"amount": 1e2}',
    b'{"amount": -0}',
    b'{"amount": 3, "amount": 5}',
]
"""Values orjson takes that the columns may not: the per-message path then takes their run."""


def good_value(rng: random.Random, floats: bool) -> bytes:
    amount: float = rng.randint(-50, 50)
    if floats:
        amount = amount / 4  # exact in binary, so sums agree whatever the order of addition
    return orjson.dumps({"customer": "c", "amount": amount, "note": "x" * rng.randint(0, 20)})


def random_batch(
    rng: random.Random, start_offsets: dict[int, int], bad_share: float, clocks: dict[int, int]
) -> list[Message]:
    """Runs of messages per partition (as librdkafka hands them over), some of them bad; event
    times move on 0-40 ms a message per partition (`clocks`), some lag behind, up to late ones."""
    messages = []
    floats = rng.random() < 0.3
    for run in range(rng.randint(1, 6)):
        partition = rng.choice((*HELD, 2)) if run else rng.choice(HELD)
        for _ in range(rng.randint(1, 300)):
            key: bytes | None = f"c{rng.randint(0, 40)}".encode()
            value: bytes | None = good_value(rng, floats)
            roll = rng.random()
            if roll < bad_share:
                value = rng.choice(BAD_VALUES)
            elif roll < bad_share * 1.5:
                value = rng.choice(ODD_GOOD_VALUES)
            elif roll < bad_share * 1.7:
                key = rng.choice([None, b"\xff\xfe", b"\xed\xa0\x80"])
            offset = start_offsets[partition]
            start_offsets[partition] += 1
            clocks[partition] += rng.randint(0, 40)
            timestamp = clocks[partition]
            if rng.random() < bad_share * 3:
                timestamp -= rng.randint(0, 1600)  # behind stream time: in grace, or late
            elif rng.random() < bad_share / 4:
                timestamp = -1  # none: a window has no event time for it
            messages.append(
                Message(
                    topic=SOURCE, partition=partition, offset=offset, key=key, value=value, timestamp=(1, timestamp)
                )
            )
    return messages


@dataclass
class Processing:
    """One processor, its transactions on RocksDB, and what it sent to the dead-letter topic."""

    transactions: dict[int, PartitionTransaction]
    processor: BatchProcessor | VectorizedBatchProcessor
    counts: dict[int, int]
    sent: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    """What went to the dead-letter and output topics, in order: (topic, key, value)."""
    stopped_at: tuple[int, int] | None = None

    def feed(self, messages: list[Message], rng: random.Random) -> None:
        index = 0
        while index < len(messages) and self.stopped_at is None:
            try:
                index, _ = self.processor.process(messages, index, rng.randint(1, 700))
            except ProcessingError as error:
                self.stopped_at = (error.partition, error.offset)

    def state(self) -> dict[int, tuple[int | None, dict[bytes, tuple[Any, int]]]]:
        """Per partition: the next offset, and each changed key's aggregate and offset."""
        return {
            partition: (
                txn.next_offset,
                {key: (orjson.loads(value or b"null"), offset) for key, value, offset in txn.changes("aggregates")},
            )
            for partition, txn in self.transactions.items()
        }

    def commit(self) -> None:
        for txn in self.transactions.values():
            if txn.has_progress:
                txn.prepare_commit()
                changes = txn.changes("aggregates")
                txn.stores["aggregates"].commit(((k, v) for k, v, _ in changes), None, txn.offset_to_commit)
                txn.committed()


def processing(
    parts: dict[int, StorePartition],
    policy: str,
    aggregator: Aggregator,
    vectorized: bool,
    committed: int | None = None,
    windowing: tuple[int, int, int] | None = None,
    after_windows: Any = None,
) -> Processing:
    """windowing: (size, step, grace) of a windowed aggregation emitting final(), whose results go
    through `after_windows` (an apply) when given."""
    config = AppConfig(
        name="app",
        source=SOURCE,
        stores=("aggregates",),
        on_error=policy,  # type: ignore[arg-type]
        output="windows",
        emits_output=True,
    )
    frame = StreamingDataFrame(["aggregates"])
    if windowing is None:
        frame.aggregate(aggregator, name="agg")
    else:
        size, step, grace = windowing
        frame.hopping_window(size, step, grace=grace).aggregate(aggregator, name="agg").final()
        if after_windows is not None:
            frame.apply(after_windows)
    transactions = {
        partition: PartitionTransaction(partition, {"aggregates": part}, JsonSerde(), committed, frame.live_stores)
        for partition, part in parts.items()
    }
    counts: dict[int, int] = {}
    sent: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(topic: str, key: bytes | None, value: bytes | None, headers: Any = None) -> None:
        sent.append((topic, key, value))

    def on_damage(partition: int, error: Exception) -> None:
        raise AssertionError(f"no store is damaged here: {error}")

    per_message = BatchProcessor(
        config, frame, transactions, Restorations(), BadInputHandler(config.on_error, produce, "dead"), produce,
        counts, on_damage,
    )  # fmt: skip
    processor: BatchProcessor | VectorizedBatchProcessor = per_message
    if vectorized:
        assert frame.vectorized is not None
        processor = VectorizedBatchProcessor(config, frame.vectorized, per_message)
    return Processing(transactions, processor, counts, sent)


def decoded(sent: list[tuple[str, bytes | None, bytes | None]]) -> list[tuple[str, bytes | None, Any]]:
    """What was sent, window results decoded: a number is equal whether an int or a float (a float
    column of the batch makes a max of 8 the float 8.0, which the store holds as such either way)."""
    return [(topic, key, orjson.loads(value) if topic == "windows" and value else value) for topic, key, value in sent]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[dict[int, StorePartition], dict[int, StorePartition]]]:
    opened = []
    sides = []
    for side in ("per-message", "columns"):
        directory = StateDirectory(tmp_path / side, AppConfig(name="app", source=SOURCE, stores=("aggregates",)))
        parts = {partition: directory.partition("aggregates", partition) for partition in HELD}
        for part in parts.values():
            part.open()
            opened.append(part)
        sides.append(parts)
    yield sides[0], sides[1]
    for part in opened:
        part.close()


@pytest.mark.parametrize("windowing", sorted(WINDOWINGS))
@pytest.mark.parametrize("policy", ["skip", "dead-letter", "raise"])
@pytest.mark.parametrize("kind", sorted(AGGREGATORS))
def test_the_columns_keep_what_the_per_message_path_keeps_for_any_batch(stores, kind: str, policy: str, windowing):
    rng = random.Random(f"{SEED}-{kind}-{policy}-{windowing}")
    windows = WINDOWINGS[windowing]
    plain = processing(stores[0], policy, AGGREGATORS[kind](), vectorized=False, windowing=windows)
    columns = processing(stores[1], policy, AGGREGATORS[kind](), vectorized=True, windowing=windows)
    offsets = dict.fromkeys((*HELD, 2), 0)
    clocks = dict.fromkeys((*HELD, 2), 1_800_000_000_000)
    for round_ in range(12):
        bad_share = 0.0 if round_ == 0 else rng.choice([0.0, 0.0, 0.002, 0.05])
        batch = random_batch(rng, offsets, bad_share, clocks)
        replay = f"FAULT_SEED={SEED}, round {round_}"
        budget_seed = rng.random()
        plain.feed(batch, random.Random(budget_seed))
        columns.feed(batch, random.Random(budget_seed))

        assert columns.stopped_at == plain.stopped_at, f"{replay}: both stop at the same bad message"
        assert columns.state() == plain.state(), f"{replay}: the same aggregates, offsets and positions"
        assert decoded(columns.sent) == decoded(plain.sent), f"{replay}: the same windows closed and dead letters"
        assert columns.counts == plain.counts, replay
        if plain.stopped_at is not None:
            break
        if round_ % 3 == 2:
            plain.commit()
            columns.commit()
    assert isinstance(columns.processor, VectorizedBatchProcessor)
    assert columns.processor.runs_in_columns > 0, f"FAULT_SEED={SEED}: the clean first batch is folded in columns"
    if windows is not None and plain.stopped_at is None:  # a raise may stop both before any window closes
        assert any(topic == "windows" for topic, _, _ in plain.sent), f"FAULT_SEED={SEED}: windows closed"


@pytest.mark.parametrize("policy", ["skip", "dead-letter", "raise"])
def test_a_closed_window_that_a_later_step_refuses_goes_to_the_error_policy_as_message_by_message(stores, policy):
    def refuse_twelve(window: dict[str, Any]) -> dict[str, Any]:
        if window["value"] == 12:
            raise ValueError("twelve is refused")
        return window

    plain, columns = (
        processing(side, policy, Count(), vectorized, windowing=(1000, 1000, 0), after_windows=refuse_twelve)
        for side, vectorized in zip(stores, (False, True), strict=True)
    )
    batch = [
        Message(topic=SOURCE, partition=0, offset=i, key=f"c{i % 3}".encode(), value=b"{}", timestamp=(1, 100 * i))
        for i in range(200)
    ]  # three customers, ten orders a window: c0 and c1 count 3 and 4 orders a window, c2 3 or 4; none 12
    batch += [
        Message(topic=SOURCE, partition=0, offset=200 + i, key=b"big", value=b"{}", timestamp=(1, 20_000 + i))
        for i in range(12)
    ]  # twelve in window 20000, refused when a message closes it
    batch += [
        Message(topic=SOURCE, partition=0, offset=212 + i, key=b"c0", value=b"{}", timestamp=(1, 21_000 + 100 * i))
        for i in range(40)
    ]

    for side in (plain, columns):
        side.feed(batch, random.Random(0))

    assert columns.stopped_at == plain.stopped_at
    assert columns.state() == plain.state()
    assert decoded(columns.sent) == decoded(plain.sent)
    assert (plain.stopped_at is None) == (policy != "raise")
    refused = [entry for entry in plain.sent if entry[0] == "dead"]
    assert (len(refused) > 0) == (policy == "dead-letter"), "the message closing window 20000 is refused"
    assert isinstance(columns.processor, VectorizedBatchProcessor) and columns.processor.runs_in_columns > 0


def test_a_clean_batch_is_folded_in_columns_onto_what_rocksdb_holds(stores):
    first = processing(stores[1], "raise", Sum("amount"), vectorized=True)
    orders = [(f"c{i % 7}".encode(), 1 + i % 5) for i in range(500)]
    batch = [
        Message(topic=SOURCE, partition=0, offset=i, key=key, value=orjson.dumps({"amount": amount}))
        for i, (key, amount) in enumerate(orders)
    ]
    first.feed(batch[:300], random.Random(0))
    first.commit()
    columns = processing(stores[1], "raise", Sum("amount"), vectorized=True, committed=300)  # nothing cached

    columns.processor.process(batch[300:], 0, 200)

    expected: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    for offset, (key, amount) in enumerate(orders):
        expected[key] = expected.get(key, 0) + amount
        last[key] = offset
    kept = columns.state()[0]
    assert kept[0] == 500
    assert {key[4:-3]: value for key, value in kept[1].items()} == {key: (expected[key], last[key]) for key in expected}
    assert isinstance(columns.processor, VectorizedBatchProcessor)
    assert columns.processor.runs_in_columns == 1 and columns.processor.runs_per_message == 0


@pytest.mark.parametrize(
    ("values", "decoded"),
    [
        ([b'{"amount": 3}', b'{"amount": -4, "x": "y"}'], [3, -4]),
        ([b'{"amount": 3}', b'{"amount": 0.25}'], [3.0, 0.25]),
        ([b'{"amount": 4611686018427387904}', b'{"amount": 1}'], None),  # an int64 sum could overflow
        ([b'{"amount": -9223372036854775808}'], None),  # its magnitude is no int64
        ([b'{"amount": 9223372036854775808}'], None),  # no int64: a float64 would round it
        ([b'{"amount": 9007199254740993.5}'], None),  # past 2**53: float64 sums lose units
        ([b'{"amount": 1}', b'{"amount": 2}\n'], [1, 2]),  # whitespace around a value, as orjson takes it
        ([b'{"amount": 1}', b'{"amount": true}'], None),  # a bool is no number to the aggregators
        ([b'{"amount": 1}', b'{"amount": null}'], None),
        ([b'{"amount": 1}', b'{"other": 2}'], None),
        ([b'{"amount": 1}', b"[1, 2]"], None),
        ([b'{"amount": 1}', b'{"amount": NaN}'], None),  # orjson refuses NaN
    ],
)
def test_a_column_is_decoded_only_where_numpy_computes_as_python_would(values, decoded):
    column = decode_field(values, "amount")

    assert (None if column is None else column.tolist()) == decoded
