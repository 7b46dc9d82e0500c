"""State values under the error policy, end to end with a real broker.

A value the state serializer refuses fails the message that set it (inside its step), so the app's
`on_error` policy applies to that message instead of every later commit crashing; and a value a step
got from state and changed in place, in a message that then failed, leaves the stored state as it was.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import FAST_GROUP, store_content
from support.kafka_helpers import create_topic

from dagster_stateful.core import App, State
from dagster_stateful.errors import ProcessingError


class NegativeAmount(Exception):
    """What the tracking step raises after it changed the state value in place."""


def order(customer: str, amount: int, **extra: object) -> tuple[bytes, bytes]:
    return customer.encode(), orjson.dumps({"customer": customer, "amount": amount, **extra})


def produce_in_order(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, partition=0, on_delivery=lambda e, _m: errors.append(str(e)) if e else None
        )
    assert producer.flush(30) == 0 and not errors, errors


def one_partition_source(bootstrap: str, name: str, records: list[tuple[bytes, bytes]]) -> str:
    create_topic(bootstrap, name, partitions=1)
    produce_in_order(bootstrap, name, records)
    return name


def total_and_tags(order: dict, state: State) -> dict:
    state.set("total", state.get("total", 0) + order["amount"])
    if "tags" in order:
        state.set("tags", set(order["tags"]))  # JSON has no sets: the serializer refuses this value
    return order


def track_in_place(order: dict, state: State) -> dict:
    record = state.get("record", {"total": 0, "count": 0})
    record["total"] += order["amount"]
    record["count"] += 1
    if order["amount"] < 0:
        raise NegativeAmount(f"amount {order['amount']} is negative")  # after changing `record` in place
    state.set("record", record)
    return order


def app_with(step, bootstrap: str, source: str, state_dir: Path, name: str, **settings) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        **{"commit_interval": 0.5, **settings},
    )
    app.dataframe().apply(step, stateful=True)
    return app


def state_of(app: App) -> dict[str, dict[str, object]]:
    """{customer: {state key: value}} of the committed 'totals' store (one partition)."""
    result: dict[str, dict[str, object]] = {}
    for (message_key, state_key), value in store_content(app, "totals", 1).items():
        result.setdefault(message_key.decode(), {})[state_key.decode()] = orjson.loads(value)
    return result


def committed(app: App) -> dict[int, int | None]:
    return app.kafka.committed_offsets(app.consumer_group, app.source, [0])


def test_an_unserializable_state_value_is_skipped_with_its_message_and_commits_go_on(
    kafka_bootstrap, unique_name, tmp_path
):
    records = [order("a", 5), order("b", 7), order("a", 100, tags=["vip"]), order("a", 2), order("b", 3)]
    source = one_partition_source(kafka_bootstrap, unique_name("orders"), records)
    app = app_with(total_and_tags, kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="skip")

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up" and report.skipped == 1
    assert committed(app) == {0: len(records)}
    assert state_of(app) == {"a": {"total": 7}, "b": {"total": 10}}, "the bad message left no trace"

    more = [order("a", 1), order("b", 1)]
    produce_in_order(kafka_bootstrap, source, more)
    again = app_with(total_and_tags, kafka_bootstrap, source, tmp_path, app.name, on_error="skip")
    second = again.run_worker(max_seconds=60)

    assert second.stop_reason == "caught_up" and second.total_processed == len(more) and second.skipped == 0
    assert committed(app) == {0: len(records) + len(more)}
    assert state_of(app) == {"a": {"total": 8}, "b": {"total": 11}}


def test_an_unserializable_state_value_under_raise_names_its_message(kafka_bootstrap, unique_name, tmp_path):
    records = [order("a", 5), order("b", 7), order("a", 100, tags=["vip"]), order("a", 2)]
    source = one_partition_source(kafka_bootstrap, unique_name("orders"), records)
    app = app_with(total_and_tags, kafka_bootstrap, source, tmp_path, unique_name("totals"))

    with pytest.raises(ProcessingError) as raised:
        app.run_worker(max_seconds=60)

    error = raised.value
    assert (error.topic, error.partition, error.offset) == (source, 0, 2)
    message = str(error)
    assert f"{source}[0] offset 2" in message and "'tags'" in message and "set" in message, message
    assert committed(app) == {0: 2}, "everything before the bad message, nothing from it on"
    assert state_of(app) == {"a": {"total": 5}, "b": {"total": 7}}


def test_a_value_changed_in_place_by_a_failed_message_is_not_stored(kafka_bootstrap, unique_name, tmp_path):
    records = [order("a", 5), order("a", -100), order("a", 2), order("b", 7)]
    source = one_partition_source(kafka_bootstrap, unique_name("orders"), records)
    # One commit at the end: the failed message meets the value the first one left in the write cache.
    app = app_with(
        track_in_place, kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="skip", commit_interval=300
    )

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up" and report.skipped == 1
    assert committed(app) == {0: len(records)}
    assert state_of(app) == {"a": {"record": {"total": 7, "count": 2}}, "b": {"record": {"total": 7, "count": 1}}}
