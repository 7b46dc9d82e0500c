"""In-memory and LRU stores in a worker, against a real broker with aggressive changelog compaction.

An in-memory store starts empty in every run and is restored in full from its changelog: its
totals, read from the output and the changelog, equal the totals recomputed from the source, also
after the next run restored and went on. An LRU store keeps at most `max_entries` keys per
partition: the changelog's live keys per partition stay within the bound, every eviction is a
tombstone, and each kept customer's total is exactly the sum of its orders after its last eviction
(read from the tombstone's source offset header), before and after a restore.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest
from support.core_helpers import FAST_COMMITS, FAST_GROUP, add_to_total, expected_totals, make_orders, orders_topic
from support.kafka_helpers import create_topic, produce, read_committed, read_messages

from dagster_stateful.core import App, Store
from dagster_stateful.core.state.keys import split_store_key

PARTITIONS = 3
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}


def app_with(store: Store, bootstrap: str, source: str, name: str, state_dir, guarantee: str) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-totals",
        stores=[store],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=200,
        **FAST_COMMITS,
    )
    app.to_topic(app.dataframe().apply(add_to_total, stateful=True))
    return app


def changelog_totals(bootstrap: str, topic: str) -> dict[str, int]:
    """Each customer's latest total in the changelog (read_committed)."""
    totals = {}
    for message in read_committed(bootstrap, topic):
        totals[split_store_key(message.key())[0].decode()] = orjson.loads(message.value())
    return totals


def last_outputs(bootstrap: str, topic: str) -> dict[str, int]:
    totals = {}
    for message in read_committed(bootstrap, topic):
        result = orjson.loads(message.value())
        totals[result["customer"]] = result["total"]
    return totals


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_an_in_memory_store_is_restored_in_full_on_every_run_and_loses_nothing(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    first = make_orders(1_200, 30)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, first)
    name = unique_name("memory")
    create_topic(kafka_bootstrap, f"{name}-totals", PARTITIONS)
    store = Store("totals", kind="memory")

    report = app_with(store, kafka_bootstrap, source, name, tmp_path, guarantee).run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == 1_200
    assert last_outputs(kafka_bootstrap, f"{name}-totals") == expected_totals(first)
    assert changelog_totals(kafka_bootstrap, f"{name}-totals-changelog") == expected_totals(first)

    second = make_orders(900, 30, start=1_200)
    produce(kafka_bootstrap, source, second)
    again = app_with(store, kafka_bootstrap, source, name, tmp_path, guarantee).run_worker(max_seconds=120)

    assert again.total_processed == 900
    assert sum(restore.records_applied for restore in again.restores) >= 30, "every total came back from the changelog"
    assert all(restore.start_offset == 0 for restore in again.restores), "restored in full"
    assert last_outputs(kafka_bootstrap, f"{name}-totals") == expected_totals(first + second)


def test_an_lru_store_stays_within_its_bound_with_tombstones_and_continues_what_it_kept_after_a_restore(
    kafka_bootstrap, unique_name, tmp_path
):
    bound = 8
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, make_orders(1_500, 60))
    name = unique_name("lru")
    create_topic(kafka_bootstrap, f"{name}-totals", PARTITIONS)
    store = Store("totals", kind="lru", max_entries=bound)

    report = app_with(store, kafka_bootstrap, source, name, tmp_path, "at-least-once").run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up"
    first = check_lru(kafka_bootstrap, source, name, bound)

    produce(kafka_bootstrap, source, make_orders(900, 60, start=1_500))
    again = app_with(store, kafka_bootstrap, source, name, tmp_path, "at-least-once").run_worker(max_seconds=120)

    assert again.total_processed == 900 and again.restores
    check_lru(kafka_bootstrap, source, name, bound, before=first)


@dataclass(frozen=True)
class LruRun:
    kept: set[str]
    """Customers whose key the changelog holds."""
    outputs: dict[str, int]
    """Outputs per customer so far."""


def check_lru(bootstrap: str, source: str, name: str, bound: int, before: LruRun | None = None) -> LruRun:
    """At most `bound` live keys per changelog partition, each holding its customer's last output;
    every output is the previous one plus the order's amount, or the amount alone after an eviction,
    and a customer continues across runs only when the run `before` left it in the changelog."""
    live: dict[tuple[int, str], int] = {}
    for message in read_messages(bootstrap, f"{name}-totals-changelog"):
        where = (message.partition(), split_store_key(message.key())[0].decode())
        if message.value() is None:
            live.pop(where, None)
        else:
            live[where] = orjson.loads(message.value())
    for partition in range(PARTITIONS):
        assert 0 < sum(1 for p, _ in live if p == partition) <= bound, f"partition {partition} within its bound"
    amounts: dict[str, list[int]] = {}
    for message in sorted(read_messages(bootstrap, source), key=lambda m: (m.partition(), m.offset())):
        order = orjson.loads(message.value())
        amounts.setdefault(order["customer"], []).append(order["amount"])
    outputs: dict[str, list[int]] = {}
    for message in read_messages(bootstrap, f"{name}-totals"):
        result = orjson.loads(message.value())
        outputs.setdefault(result["customer"], []).append(result["total"])
    restarts = 0
    for customer, totals in outputs.items():
        assert len(totals) == len(amounts[customer]), f"one output per order of {customer}"
        previous = 0
        for index, (total, amount) in enumerate(zip(totals, amounts[customer], strict=True)):
            assert total in (previous + amount, amount), f"{customer}'s output {index}: {total}"
            if previous and total == amount:
                restarts += 1
            if before is not None and index == before.outputs.get(customer, 0) and previous:
                continued = total == previous + amount
                assert not continued or customer in before.kept, f"{customer} continued although it was evicted"
            previous = total
    assert restarts > 0, "60 customers in stores of 8 keys per partition: evicted customers started again"
    assert {customer: total for (_, customer), total in live.items()} == {
        customer: outputs[customer][-1] for _, customer in live
    }, "each kept key holds its customer's last output"
    return LruRun({customer for _, customer in live}, {customer: len(totals) for customer, totals in outputs.items()})
