"""Bad input under each error policy: raise stops at the message, skip counts it, dead-letter keeps it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import (
    FAST_COMMITS,
    FAST_GROUP,
    expected_totals,
    make_orders,
    store_content,
    totals_app,
    totals_in_store,
)
from support.kafka_helpers import create_topic, read_messages

from dagster_stateful.core import App, AppState, State
from dagster_stateful.core.processing.paths.bad_input import ERROR_HEADER_PREFIX
from dagster_stateful.errors import ProcessingError

NOT_JSON = b"{not json"


class NegativeAmount(Exception):
    """What the validating step raises; its own type so the dead-letter header can be told apart."""


def reject_negative(order: dict) -> None:
    if order["amount"] < 0:
        raise NegativeAmount(f"amount {order['amount']} is negative")


def count_and_total(order: dict, state: State) -> dict:
    state.set("total", state.get("total", 0) + order["amount"])
    state.set("count", state.get("count", 0) + 1)
    return order


def order(customer: str, amount: int) -> tuple[bytes, bytes]:
    return customer.encode(), orjson.dumps({"customer": customer, "amount": amount})


def source_with(
    bootstrap: str,
    name: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    headers: dict[int, list[tuple[str, str | bytes | None]]] | None = None,
) -> str:
    """A one-partition topic holding `records` in order (offset i = records[i]), with optional headers by index."""
    create_topic(bootstrap, name, partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    for index, (key, value) in enumerate(records):
        producer.produce(
            name,
            key=key,
            value=value,
            partition=0,
            headers=(headers or {}).get(index),
            on_delivery=lambda error, _m: errors.append(str(error)) if error else None,
        )
    assert producer.flush(30) == 0 and not errors, errors
    return name


def validated_app(bootstrap: str, source: str, state_dir: Path, name: str, **settings) -> App:
    """Steps: count_and_total (stateful: writes total and count), then reject_negative (raises on amount < 0)."""
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        **{**FAST_COMMITS, **settings},
    )
    app.dataframe().apply(count_and_total, stateful=True).update(reject_negative)
    return app


def committed(app: App) -> dict[int, int | None]:
    return app.kafka.committed_offsets(app.consumer_group, app.source, [0])


def state_of(app: App) -> dict[str, dict[str, int]]:
    """{customer: {state key: value}} of the app's 'totals' store (one partition)."""
    result: dict[str, dict[str, int]] = {}
    for (message_key, state_key), value in store_content(app, "totals", 1).items():
        result.setdefault(message_key.decode(), {})[state_key.decode()] = orjson.loads(value)
    return result


def expected_state(records: list[tuple[bytes, bytes]]) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    for key, value in records:
        entry = result.setdefault(key.decode(), {"total": 0, "count": 0})
        entry["total"] += orjson.loads(value)["amount"]
        entry["count"] += 1
    return result


def read_with_headers(bootstrap: str, topic: str) -> list[dict]:
    """Every record of `topic` from the beginning to its current end, with its headers."""
    return [
        {"key": m.key(), "value": m.value(), "headers": dict(m.headers() or [])}
        for m in read_messages(bootstrap, topic)
    ]


# --- raise (the default) -------------------------------------------------------------------------------------


def test_raise_stops_at_undeserializable_message_and_commits_nothing_past_it(kafka_bootstrap, unique_name, tmp_path):
    before, after = make_orders(12, customers=3), make_orders(6, customers=3, start=12)
    bad_offset = len(before)
    source = source_with(kafka_bootstrap, unique_name("orders"), [*before, (b"c1", NOT_JSON), *after])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    states: list[AppState] = []
    app.add_state_listener(lambda new, _old: states.append(new))

    worker = app.worker(max_seconds=60)
    with pytest.raises(ProcessingError) as raised:
        worker.run()

    error = raised.value
    assert worker.report.messages_processed == {0: bad_offset}, "the report counts what came before it"
    assert f"{source}[0] offset {bad_offset}" in str(error), str(error)
    assert (error.topic, error.partition, error.offset) == (source, 0, bad_offset)
    assert states[-1] is AppState.ERROR
    assert committed(app) == {0: bad_offset}, "everything before the bad message, nothing from it on"
    assert totals_in_store(app, 1) == expected_totals(before)

    # Rerunning meets the same message again: nothing after it was lost or half-applied.
    with pytest.raises(ProcessingError) as again:
        totals_app(kafka_bootstrap, source, tmp_path, app.name).run_worker(max_seconds=60)
    assert again.value.offset == bad_offset
    assert committed(app) == {0: bad_offset}
    assert totals_in_store(app, 1) == expected_totals(before)


def test_raise_on_failing_step_leaves_no_trace_of_that_message(kafka_bootstrap, unique_name, tmp_path):
    before = [order("a", 5), order("b", 7), order("a", 1)]
    bad = order("a", -100)  # count_and_total writes a's state, then reject_negative raises
    after = [order("a", 2), order("b", 3)]
    source = source_with(kafka_bootstrap, unique_name("orders"), [*before, bad, *after])
    app = validated_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))

    with pytest.raises(ProcessingError) as raised:
        app.run_worker(max_seconds=60)

    message = str(raised.value)
    assert f"{source}[0] offset 3" in message and "reject_negative" in message and "NegativeAmount" in message
    assert isinstance(raised.value.__cause__, NegativeAmount)
    assert committed(app) == {0: 3}
    assert state_of(app) == {"a": {"total": 6, "count": 2}, "b": {"total": 7, "count": 1}}


# --- skip ----------------------------------------------------------------------------------------------------


def test_skip_counts_bad_messages_and_processes_the_rest(kafka_bootstrap, unique_name, tmp_path):
    good = make_orders(20, customers=4)
    bad_key = (b"\xff\xfe", orjson.dumps({"customer": "c1", "amount": 500}))  # not UTF-8: the str key serde refuses it
    records = [
        *good[:7],
        (b"c1", NOT_JSON),
        *good[7:15],
        (b"c2", b"\xff\xfe"),
        *good[15:18],
        bad_key,
        *good[18:],
        (b"c3", b'{"amount": '),
    ]
    source = source_with(kafka_bootstrap, unique_name("orders"), records)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="skip")

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up"
    assert report.skipped == 4 and report.dead_lettered == 0
    assert report.lag == {0: 0}
    assert committed(app) == {0: len(records)}, "the end of the partition, even though the last message was bad"
    assert totals_in_store(app, 1) == expected_totals(good)


def test_skip_of_failing_step_discards_its_state_writes(kafka_bootstrap, unique_name, tmp_path):
    # The bad message's key sees more messages in the same commit: they must not see its staged writes.
    records = [order("a", 5), order("a", -100), order("a", 2), order("b", 7), order("b", -1), order("a", 1)]
    source = source_with(kafka_bootstrap, unique_name("orders"), records)
    app = validated_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="skip")

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up" and report.skipped == 2
    assert committed(app) == {0: len(records)}
    good = [record for record in records if orjson.loads(record[1])["amount"] >= 0]
    assert state_of(app) == expected_state(good) == {"a": {"total": 8, "count": 3}, "b": {"total": 7, "count": 1}}


# --- dead-letter ---------------------------------------------------------------------------------------------


def test_dead_letter_keeps_raw_message_and_says_why(kafka_bootstrap, unique_name, tmp_path):
    records = [order("a", 5), (b"a", NOT_JSON), order("b", 7), order("b", -3), order("a", 1)]
    source = source_with(kafka_bootstrap, unique_name("orders"), records, headers={1: [("trace-id", b"t-1")]})
    app = App(
        name=unique_name("totals"),
        source=source,
        stores=["totals"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        consumer_config=FAST_GROUP,
        on_error="dead-letter",
        **FAST_COMMITS,
    )
    app.dataframe().update(reject_negative).apply(count_and_total, stateful=True)

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up"
    assert report.dead_lettered == 2 and report.skipped == 0
    assert committed(app) == {0: len(records)}
    assert state_of(app) == expected_state([records[0], records[2], records[4]])
    assert app.dead_letter_topic == f"{app.name}-dead-letter"
    letters = read_with_headers(kafka_bootstrap, app.dead_letter_topic)
    assert [(letter["key"], letter["value"]) for letter in letters] == [records[1], records[3]], "raw key and value"

    def header(letter: dict, name: str) -> bytes:
        return letter["headers"][f"{ERROR_HEADER_PREFIX}{name}"]

    not_json, negative = letters
    assert not_json["headers"]["trace-id"] == b"t-1", "the message's own headers are kept"
    assert header(not_json, "error-type") == b"ValueError"
    assert header(not_json, "error-message").startswith(b"invalid JSON"), "the codec's own description"
    assert header(negative, "error-type") == b"NegativeAmount"
    assert b"reject_negative" in header(negative, "stage")
    assert b"negative" in header(negative, "error-message")
    for letter, offset in ((not_json, 1), (negative, 3)):
        assert header(letter, "source-topic") == source.encode()
        assert header(letter, "source-partition") == b"0"
        assert header(letter, "source-offset") == str(offset).encode()


# --- a message without a key reaching a stateful step --------------------------------------------------------


def test_null_key_for_stateful_step_is_skipped_under_skip(kafka_bootstrap, unique_name, tmp_path):
    good = make_orders(8, customers=3)
    keyless = (None, orjson.dumps({"customer": "nobody", "amount": 1000}))
    source = source_with(kafka_bootstrap, unique_name("orders"), [*good[:4], keyless, *good[4:]])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="skip")

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up" and report.skipped == 1
    assert committed(app) == {0: 9}
    assert totals_in_store(app, 1) == expected_totals(good)


def test_null_key_for_stateful_step_raises_under_raise(kafka_bootstrap, unique_name, tmp_path):
    good = make_orders(8, customers=3)
    keyless = (None, orjson.dumps({"customer": "nobody", "amount": 1000}))
    source = source_with(kafka_bootstrap, unique_name("orders"), [*good[:4], keyless, *good[4:]])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))

    with pytest.raises(ProcessingError) as raised:
        app.run_worker(max_seconds=60)

    assert f"{source}[0] offset 4" in str(raised.value) and "key" in str(raised.value)
    assert committed(app) == {0: 4}
    assert totals_in_store(app, 1) == expected_totals(good[:4])
