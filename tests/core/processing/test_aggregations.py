"""Keyed aggregations on a real RocksDB store (no Kafka): what each aggregator passes on and keeps,
what a commit writes, what a failed message leaves behind, and the configurations refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from support.core_helpers import opened_partition

from dagster_stateful.core import (
    Aggregate,
    AppConfig,
    Collect,
    ConfigurationError,
    Count,
    JsonSerde,
    Max,
    Mean,
    Min,
    Reduce,
    Sum,
)
from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.dataframe import DROPPED, StepFailed, StreamingDataFrame
from dagster_stateful.core.state.cache import ENTRY_OVERHEAD_BYTES, live_entry_bytes
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import StateSerializationError

ORDERS = [("a", 5), ("b", 2), ("a", 3), ("a", 9), ("b", 7), ("c", 4), ("a", 1)]


def amount(order: dict) -> int:
    return order["amount"]


@pytest.fixture
def store(tmp_path) -> Iterator[StorePartition]:
    yield from opened_partition(
        StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("aggregates", "other"))), "aggregates"
    )


def transaction(store: StorePartition, committed: int | None = None) -> PartitionTransaction:
    return PartitionTransaction(0, {"aggregates": store}, JsonSerde(), committed, live_stores={"aggregates": None})


def feed(frame: StreamingDataFrame, txn: PartitionTransaction, orders: list[tuple[str, int]], start: int = 0) -> list:
    """Each order through the frame, as the worker does; returns what came out of each."""
    outputs = []
    for offset, (customer, value) in enumerate(orders, start):
        txn.begin_message(customer.encode(), offset)
        outputs.append(frame.run({"customer": customer, "amount": value}, txn.views))
        txn.accept_message(offset)
    return outputs


def commit(txn: PartitionTransaction, store: StorePartition) -> dict[tuple[str, str], Any]:
    """Write the transaction's changes as the commit path does; returns what they were, decoded."""
    changes = txn.changes("aggregates")
    store.commit(((key, value) for key, value, _ in changes), None, txn.offset_to_commit)
    txn.committed()
    return {decode(key): orjson.loads(value) for key, value, _ in changes if value is not None}


def decode(store_key: bytes) -> tuple[str, str]:
    for customer in ("a", "b", "c"):
        prefix = message_prefix(customer.encode())
        if store_key.startswith(prefix):
            return customer, store_key[len(prefix) :].decode()
    raise AssertionError(f"unexpected store key {store_key!r}")


def recomputed(orders: list[tuple[str, int]], fold) -> tuple[list, dict[str, Any]]:
    """Per order, the running result for its customer; and the last result per customer."""
    seen: dict[str, list[int]] = {}
    running = []
    for customer, value in orders:
        seen.setdefault(customer, []).append(value)
        running.append(fold(seen[customer]))
    return running, {customer: fold(values) for customer, values in seen.items()}


@pytest.mark.parametrize(
    ("aggregator", "fold"),
    [
        (Count(), len),
        (Sum(amount), sum),
        (Min(amount), min),
        (Max(amount), max),
        (Mean(amount), lambda values: sum(values) / len(values)),
        (Reduce(lambda kept, order: {**kept, "amount": kept["amount"] * order["amount"]}), None),
        (Collect(amount), list),
        (Aggregate(list, lambda kept, order: [*kept, order["amount"]]), list),
    ],
    ids=["count", "sum", "min", "max", "mean", "reduce", "collect", "aggregate"],
)
def test_each_aggregator_passes_on_the_running_result_and_commits_the_aggregate(store, aggregator: Aggregator, fold):
    frame = StreamingDataFrame(["aggregates", "other"]).aggregate(aggregator, store="aggregates", emit="per-message")
    txn = transaction(store)

    outputs = feed(frame, txn, ORDERS)
    written = commit(txn, store)

    if isinstance(aggregator, Reduce):
        product = {"a": 5 * 3 * 9 * 1, "b": 2 * 7, "c": 4}
        assert outputs[-1] == {"customer": "a", "amount": product["a"]}
        assert {customer: kept["amount"] for (customer, _), kept in written.items()} == product
        return
    running, final = recomputed(ORDERS, fold)
    assert outputs == running
    kept = {customer: value for (customer, name), value in written.items() if name == aggregator.name}
    if isinstance(aggregator, Mean):
        kept = {customer: total / count for customer, (total, count) in kept.items()}
    assert kept == final


@pytest.mark.parametrize(
    ("aggregator", "fold"),
    [
        (Count(), len),
        (Sum("amount"), sum),
        (Min("amount"), min),
        (Max("amount"), max),
        (Mean("amount"), lambda values: sum(values) / len(values)),
    ],
    ids=["count", "sum", "min", "max", "mean"],
)
def test_a_columnar_aggregator_emits_per_commit_by_default_and_keeps_what_its_callable_twin_keeps(
    store, aggregator: Aggregator, fold
):
    frame = StreamingDataFrame(["aggregates"]).aggregate(aggregator, name="kept")
    txn = transaction(store)

    outputs = feed(frame, txn, ORDERS)
    emission = frame.commit_emission
    written = commit(txn, store)

    columnar = frame.vectorized
    assert aggregator.vectorizable and columnar is not None
    assert (columnar.store, columnar.state_key, columnar.aggregator, columnar.windows) == (
        "aggregates",
        b"kept",
        aggregator,
        None,
    )
    assert all(output is DROPPED for output in outputs), "nothing flows per message"
    assert emission is not None and emission.store == "aggregates" and emission.state_key == b"kept"
    _, final = recomputed(ORDERS, fold)
    assert {customer: emission.output(kept) for (customer, _), kept in written.items()} == final


def test_an_aggregation_emitting_per_commit_takes_only_stateless_steps_after_it():
    frame = StreamingDataFrame(["aggregates", "other"]).aggregate(Sum("amount"), store="aggregates")
    frame.apply(lambda total: {"total": total})

    with pytest.raises(ConfigurationError, match="emits per commit"):
        frame.update(lambda value, state: None, store="other")
    with pytest.raises(ConfigurationError, match="emits per commit"):
        frame.aggregate(Count(), store="other")
    assert StreamingDataFrame(["aggregates"]).aggregate(Sum(amount)).vectorized is None, "a callable goes per message"
    assert StreamingDataFrame(["a"]).filter(bool).aggregate(Count()).vectorized is None, "a step before it too"


def test_windows_of_message_timestamps_emitting_final_are_folded_in_columns_and_other_windows_are_not():
    def windowed(emit: str, timestamp: Any = None) -> StreamingDataFrame:
        frame = StreamingDataFrame(["windows"])
        windows = frame.tumbling_window(1000, timestamp=timestamp).aggregate(Sum("amount"))
        windows.final() if emit == "final" else windows.current()
        return frame.apply(lambda window: window["value"])

    columnar = windowed("final").vectorized
    assert columnar is not None and columnar.windows is not None and columnar.windows.size == 1000
    assert columnar.state_key == b"" and len(columnar.after) == 1, "window keys hold no state key; the apply follows"
    assert windowed("current").vectorized is None, "every update passes on: message by message"
    assert windowed("final", timestamp=lambda value: value["at"]).vectorized is None, "event time from a function"


@pytest.mark.parametrize("aggregator", [Sum("amount"), Mean("amount"), Min("amount"), Max("amount")])
def test_an_aggregator_of_a_named_field_refuses_a_value_that_is_no_number_and_its_key_goes_on(store, aggregator):
    frame = StreamingDataFrame(["aggregates"]).aggregate(aggregator, emit="per-message")
    txn = transaction(store)

    for offset, bad in enumerate([[1], "7", True, {"x": 1}]):
        txn.begin_message(b"a", offset)
        with pytest.raises(StepFailed, match=r"takes numbers; the value's 'amount' is"):
            frame.run({"amount": bad}, txn.views)
        txn.discard_message()
    outputs = feed(frame, txn, [("a", 4), ("a", 2)], start=4)

    assert outputs[-1] == {"sum": 6, "mean": 3.0, "min": 2, "max": 4}[aggregator.name], "no bad value poisoned it"


def test_aggregates_continue_from_what_the_store_holds_after_a_commit(store):
    frame = StreamingDataFrame(["aggregates"]).aggregate(Sum(amount), name="total")
    first = transaction(store)
    feed(frame, first, ORDERS[:4])
    commit(first, store)

    later = transaction(store, committed=4)  # a new owner: nothing cached, everything read from RocksDB
    outputs = feed(frame, later, ORDERS[4:], start=4)

    assert outputs == recomputed(ORDERS, sum)[0][4:]
    assert commit(later, store) == {("b", "total"): 9, ("c", "total"): 4, ("a", "total"): 18}


def test_a_message_failing_after_its_aggregate_leaves_no_trace(store):
    def refuse_big(total: int) -> int:
        if total > 10:
            raise ValueError("too big")
        return total

    frame = StreamingDataFrame(["aggregates"]).aggregate(Sum(amount), name="total").apply(refuse_big)
    txn = transaction(store)
    feed(frame, txn, ORDERS[:3])  # a: 5, b: 2, a: 8
    held = txn.cached_bytes

    txn.begin_message(b"a", 3)
    with pytest.raises(StepFailed, match="refuse_big"):
        frame.run({"customer": "a", "amount": 9}, txn.views)
    txn.pass_message(3)

    assert txn.cached_bytes == held
    assert commit(txn, store) == {("a", "total"): 8, ("b", "total"): 2}


def test_an_aggregate_the_serializer_refuses_fails_its_message_and_names_the_store(store):
    frame = StreamingDataFrame(["aggregates"]).aggregate(Aggregate(set, lambda kept, order: kept | {order["amount"]}))
    txn = transaction(store)
    txn.begin_message(b"a", 0)

    with pytest.raises(StepFailed) as raised:
        frame.run({"customer": "a", "amount": 1}, txn.views)

    assert isinstance(raised.value.error, StateSerializationError)
    assert "'aggregates'" in str(raised.value.error) and "set" in str(raised.value.error)


def test_an_aggregator_returning_none_fails_its_message(store):
    frame = StreamingDataFrame(["aggregates"]).aggregate(Reduce(lambda kept, order: None))
    txn = transaction(store)
    feed(frame, txn, ORDERS[:1])
    txn.begin_message(b"a", 1)

    with pytest.raises(StepFailed, match="returned None"):
        frame.run({"customer": "a", "amount": 1}, txn.views)


def test_a_live_cache_counts_its_entries_and_gives_them_back_on_undo(store):
    frame = StreamingDataFrame(["aggregates"]).aggregate(Count())
    txn = transaction(store)
    feed(frame, txn, [("a", 1)])
    one_key = txn.cached_bytes
    assert one_key >= len(message_prefix(b"a") + b"count") + ENTRY_OVERHEAD_BYTES

    feed(frame, txn, [("a", 1)], start=1)
    assert txn.cached_bytes == one_key, "a new aggregate for a cached key costs nothing more"

    txn.begin_message(b"b", 2)
    frame.run({"customer": "b", "amount": 1}, txn.views)
    txn.discard_message()
    known_absent = live_entry_bytes(message_prefix(b"b") + b"count", None)
    assert txn.cached_bytes == one_key + known_absent, "undone, only the read of the absent key stays"
    assert commit(txn, store) == {("a", "count"): 2}


@pytest.mark.parametrize("aggregate_first", [True, False])
def test_a_store_is_either_aggregated_or_used_by_other_steps(aggregate_first: bool):
    frame = StreamingDataFrame(["totals"])

    def aggregate() -> None:
        frame.aggregate(Count())

    def update() -> None:
        frame.update(print, stateful=True)

    first, second = (aggregate, update) if aggregate_first else (update, aggregate)
    first()

    with pytest.raises(ConfigurationError, match="store of its own"):
        second()


def test_two_aggregations_of_one_store_need_different_names():
    frame = StreamingDataFrame(["totals"]).aggregate(Sum(amount))

    with pytest.raises(ConfigurationError, match="another name"):
        frame.aggregate(Sum(amount))
    frame.aggregate(Sum(amount), name="sum-again")
    assert frame.aggregated_stores == {"totals"}


def test_aggregate_refuses_what_is_not_an_aggregator():
    with pytest.raises(TypeError, match="Aggregator"):
        StreamingDataFrame(["totals"]).aggregate(sum)  # type: ignore[arg-type]
