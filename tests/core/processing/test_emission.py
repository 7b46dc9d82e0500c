"""Results of an aggregation emitting per commit (Kafka Streams' record cache), on a real RocksDB
store (no Kafka): each key whose aggregate changed sends its latest result once per commit, keyed
by its message key, through the stateless steps after it; a commit that did not go through sends
again only what was written since; a rolled-back transaction sends its replay again; a step that
fails on a result gets the error policy with the partition and the offset of the key's last message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from support.core_helpers import opened_partition

from dagster_stateful.core import AppConfig, JsonSerde, Sum
from dagster_stateful.core.config import ErrorPolicy
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.paths.bad_input import ERROR_HEADER_PREFIX, BadInputHandler
from dagster_stateful.core.processing.paths.emission import CommitEmitter
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import ProcessingError

PARTITION = 2


@pytest.fixture
def store(tmp_path) -> Iterator[StorePartition]:
    directory = StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("totals",)))
    yield from opened_partition(directory, "totals", PARTITION)


class Sent:
    """What the emitter produced, by topic."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, Any, Any]] = []

    def __call__(self, topic: str, key: bytes | None, value: bytes | None, headers: Any = None) -> None:
        self.records.append((topic, key, None if value is None else orjson.loads(value), headers))

    def take(self, topic: str) -> list[tuple[bytes | None, Any]]:
        taken = [(key, value) for t, key, value, _ in self.records if t == topic]
        self.records = [record for record in self.records if record[0] != topic]
        return taken


def emitter(frame: StreamingDataFrame, sent: Sent, policy: ErrorPolicy = ErrorPolicy.RAISE) -> CommitEmitter:
    emission = frame.commit_emission
    assert emission is not None
    return CommitEmitter(emission, "orders", "out", JsonSerde().dumps, sent, BadInputHandler(policy, sent, "dead"))


def feed(frame: StreamingDataFrame, txn: PartitionTransaction, orders: list[tuple[str, int]], start: int) -> None:
    for offset, (customer, amount) in enumerate(orders, start):
        txn.begin_message(customer.encode(), offset)
        frame.run({"amount": amount}, txn.views)
        txn.accept_message(offset)


def transaction(store: StorePartition) -> PartitionTransaction:
    return PartitionTransaction(PARTITION, {"totals": store}, JsonSerde(), None, live_stores={"totals": None})


def commit(txn: PartitionTransaction, store: StorePartition) -> None:
    changes = txn.changes("totals")
    store.commit(((key, value) for key, value, _ in changes), None, txn.offset_to_commit)
    txn.committed()


def test_each_changed_key_sends_its_latest_result_once_per_commit_through_the_steps_after_it(store):
    frame = StreamingDataFrame(["totals"]).aggregate(Sum("amount"), name="total")
    frame.filter(lambda total: total != 4).apply(lambda total: {"total": total})
    sent = Sent()
    emit, txn = emitter(frame, sent), transaction(store)

    feed(frame, txn, [("a", 1), ("b", 4), ("a", 2), ("c", 5)], start=0)
    assert emit.emit([txn]) == 2
    assert sent.take("out") == [(b"a", {"total": 3}), (b"c", {"total": 5})], "b's 4 was filtered out"

    assert emit.emit([txn]) == 0, "a commit that did not go through sends only what was written since"
    feed(frame, txn, [("c", 1)], start=4)
    assert emit.emit([txn]) == 1 and sent.take("out") == [(b"c", {"total": 6})]
    commit(txn, store)

    feed(frame, txn, [("a", 10)], start=5)
    txn.roll_back()  # exactly-once: the transaction aborted and the partition is processed again
    feed(frame, txn, [("a", 10)], start=5)
    assert emit.emit([txn]) == 1 and sent.take("out") == [(b"a", {"total": 13})]


@pytest.mark.parametrize("policy", [ErrorPolicy.RAISE, ErrorPolicy.DEAD_LETTER])
def test_a_step_failing_on_a_result_gets_the_error_policy_with_its_partition_and_offset(store, policy):
    def refuse_odd(total: int) -> int:
        if total % 2:
            raise ValueError(f"odd total {total}")
        return total

    frame = StreamingDataFrame(["totals"]).aggregate(Sum("amount"), name="total").apply(refuse_odd)
    sent = Sent()
    emit, txn = emitter(frame, sent, policy), transaction(store)
    feed(frame, txn, [("a", 2), ("b", 1), ("b", 2), ("c", 4)], start=0)

    if policy is ErrorPolicy.RAISE:
        with pytest.raises(ProcessingError) as raised:
            emit.emit([txn])
        assert (raised.value.partition, raised.value.offset) == (PARTITION, 2), "b's last message"
        assert "orders[2] offset 2" in str(raised.value) and "odd total 3" in str(raised.value)
        return
    assert emit.emit([txn]) == 2
    assert sent.take("out") == [(b"a", 2), (b"c", 4)]
    letters = [record for record in sent.records if record[0] == "dead"]
    assert [(key, value) for _, key, value, _ in letters] == [(b"b", None)], "the message key, no value"
    headers = {name.removeprefix(ERROR_HEADER_PREFIX): value for name, value in letters[0][3]}
    assert headers["source-partition"] == b"2" and headers["source-offset"] == b"2", "b's last message"
    assert b"odd total 3" in headers["error-message"]


def test_nothing_is_sent_without_an_output_topic_or_steps_after_the_aggregation(store):
    frame = StreamingDataFrame(["totals"]).aggregate(Sum("amount"), name="total")
    emission = frame.commit_emission
    assert emission is not None
    sent = Sent()
    quiet = CommitEmitter(
        emission, "orders", None, JsonSerde().dumps, sent, BadInputHandler(ErrorPolicy.RAISE, sent, "d")
    )
    txn = transaction(store)
    feed(frame, txn, [("a", 1)], start=0)

    assert quiet.emit([txn]) == 0 and sent.records == []
