"""Columnar aggregations in a worker, against a real broker with aggressive changelog compaction,
under both guarantees: the totals `aggregate(Sum("amount"))` keeps (in the store, restored from the
changelog alone, and sent once per key and commit) are those recomputed from the source topic; and
bad messages among good ones keep their error policy (skip, dead-letter, raise) with no good
message lost or doubled."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from support.core_helpers import (
    FAST_COMMITS,
    FAST_GROUP,
    checkpoint_of,
    expected_totals,
    make_orders,
    orders_topic,
    totals_in_store,
)
from support.kafka_helpers import create_topic, produce, read_committed, read_messages

from dagster_stateful.core import App, Sum
from dagster_stateful.core.processing.paths import vectorized
from dagster_stateful.errors import ProcessingError

PARTITIONS = 3
CUSTOMERS = 150
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
BAD = [b"not json", b'{"customer": "nobody"}', b'{"customer": "c1", "amount": "12"}', b'{"amount": null}']
"""A message that is not JSON, one without the field, one whose field is a string, one whose field is null."""


def summing_app(bootstrap: str, source: str, state_dir: Path, name: str, guarantee: str, **settings) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        **{**FAST_COMMITS, **settings},
    )
    app.dataframe().aggregate(Sum("amount"), name="total")
    return app


def sent_totals(bootstrap: str, topic: str) -> dict[str, list[int]]:
    """Per customer, the totals a `read_committed` reader sees on `topic`, in order."""
    sent: dict[str, list[int]] = {}
    for message in sorted(read_committed(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        sent.setdefault(message.key().decode(), []).append(orjson.loads(message.value()))
    return sent


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_columnar_totals_equal_the_source_are_sent_per_commit_and_continue_after_a_restore(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    orders = make_orders(6_000, CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, orders)
    name = unique_name("columns")
    output = f"{name}-totals"
    create_topic(kafka_bootstrap, output, PARTITIONS)
    app = summing_app(kafka_bootstrap, source, tmp_path, name, guarantee, output=output)
    app.to_topic(app.dataframe())

    first = app.run_worker(max_seconds=120)

    assert first.stop_reason == "caught_up" and first.total_processed == len(orders)
    assert first.messages_in_columns == len(orders), "every clean run is folded in columns"
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)

    more = make_orders(3_000, CUSTOMERS, start=len(orders))
    produce(kafka_bootstrap, source, more)
    shutil.rmtree(tmp_path / name)  # a new machine: the totals come back from the changelog alone
    restarted = summing_app(kafka_bootstrap, source, tmp_path, name, guarantee, output=output)
    restarted.to_topic(restarted.dataframe())

    second = restarted.run_worker(max_seconds=120)

    assert second.stop_reason == "caught_up" and second.total_processed == len(more)
    assert sum(restore.records_applied for restore in second.restores) > 0
    final = expected_totals(orders + more)
    assert totals_in_store(restarted, PARTITIONS) == final
    sent = sent_totals(kafka_bootstrap, output)
    assert {customer: totals[-1] for customer, totals in sent.items()} == final, "the latest total was sent last"
    for customer, totals in sent.items():
        assert totals == sorted(set(totals)), f"{customer}: each commit sends a key's total once, growing"
    assert sum(map(len, sent.values())) < len(orders + more) / 2, "one result per key and commit, not per order"


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_bad_messages_among_good_ones_keep_their_policy_on_the_columnar_path(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    good = make_orders(3_000, CUSTOMERS)
    records = list(good)
    for index, bad in zip(range(500, 3_000, 500), BAD * 2, strict=False):
        records.insert(index, (f"c{index % CUSTOMERS}".encode(), bad))
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, records)
    bad_offsets = {
        (message.partition(), message.offset()) for message in read_messages(kafka_bootstrap, source)
        if message.value() in BAD
    }  # fmt: skip
    assert len(bad_offsets) == 5

    skipping = summing_app(kafka_bootstrap, source, tmp_path, unique_name("skip"), guarantee, on_error="skip")
    skipped = skipping.run_worker(max_seconds=120)
    assert skipped.skipped == len(bad_offsets) and skipped.total_processed == len(records)
    assert totals_in_store(skipping, PARTITIONS) == expected_totals(good)
    assert skipped.messages_in_columns > len(good) * 0.9, "only a few messages around each bad one go one by one"

    name = unique_name("dead-letter")
    dead_lettering = summing_app(kafka_bootstrap, source, tmp_path, name, guarantee, on_error="dead-letter")
    dead_lettered = dead_lettering.run_worker(max_seconds=120)
    assert dead_lettered.dead_lettered == len(bad_offsets)
    assert totals_in_store(dead_lettering, PARTITIONS) == expected_totals(good)
    letters = read_committed(kafka_bootstrap, dead_lettering.dead_letter_topic)
    assert sorted(message.value() for message in letters) == sorted(BAD + BAD[:1])

    raising = summing_app(kafka_bootstrap, source, tmp_path, unique_name("raise"), guarantee)
    with pytest.raises(ProcessingError) as raised:
        raising.run_worker(max_seconds=120)
    stopped_at = (raised.value.partition, raised.value.offset)
    assert stopped_at in bad_offsets and f"{source}[{stopped_at[0]}] offset {stopped_at[1]}" in str(raised.value)
    committed = {
        partition: checkpoint_of(raising.state.partition_path("totals", partition)).source_offset
        for partition in range(PARTITIONS)
    }
    assert committed[stopped_at[0]] == stopped_at[1], "everything before the bad message is committed, not it"
    before = [
        (message.key(), message.value()) for message in read_messages(kafka_bootstrap, source)
        if message.offset() < (committed[message.partition()] or 0) and message.value() not in BAD
    ]  # fmt: skip
    assert totals_in_store(raising, PARTITIONS) == expected_totals(before), (
        "what was committed holds each good message once"
    )


@pytest.mark.parametrize("customers", [50, 100])
def test_columnar_totals_stay_exact_as_the_memo_of_store_keys_fills(
    kafka_bootstrap, unique_name, tmp_path, monkeypatch, customers
):
    # Runs of 37 messages, 60 store keys remembered: runs mix keys the memo knows with new ones as it
    # fills (50 customers) and once it is full (100).
    monkeypatch.setattr(vectorized, "STORE_KEYS_REMEMBERED", 60)
    orders = make_orders(2000, customers=customers)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, orders)
    app = summing_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), "at-least-once", commit_every=37)

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == 2000
    assert totals_in_store(app, 1) == expected_totals(orders)
