"""Helpers for engine tests: an order-totals app, order messages, an open store partition, and reading
a store's content."""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypedDict

import orjson

from dagster_stateful.core import Aggregate, App, State, Sum, Timer
from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.state.checkpoint import Checkpoint, read_checkpoint
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import split_store_key
from dagster_stateful.core.state.partition import StorePartition
from support.kafka_helpers import create_topic, produce, read_committed, read_messages


class CommitSettings(TypedDict):
    commit_interval: float


FAST_COMMITS: CommitSettings = {"commit_interval": 0.5}
FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
NOT_JSON = b"not json"
"""A source message that is no order (a poison message): `running_sums` leaves it out."""


def add_to_total(order: dict, state: State) -> dict:
    total = state.get("total", 0) + order["amount"]
    state.set("total", total)
    return {"customer": order["customer"], "total": total}


def totals_app(
    bootstrap: str, source: str, state_dir: Path, name: str, step: Callable[..., Any] = add_to_total, **settings
) -> App:
    """An app keeping a total per customer in store "totals" (with `step`, a stateful apply)."""
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config={**FAST_GROUP, **settings.pop("consumer_config", {})},
        **{**FAST_COMMITS, **settings},
    )
    app.dataframe().apply(step, stateful=True)
    return app


WINDOW_MS, WINDOW_GRACE_MS = 1000, 200


def empty_tally() -> dict[str, int]:
    return {"count": 0, "total": 0}


def tally_order(tally: dict[str, int], order: dict) -> dict[str, int]:
    return {"count": tally["count"] + 1, "total": tally["total"] + order["amount"]}


def windows_app(bootstrap: str, source: str, state_dir: Path, name: str, **settings) -> App:
    """An app tallying each customer's orders (count and total) per tumbling window of event time
    (`WINDOW_MS`, `WINDOW_GRACE_MS` of grace) in store "windows", sending each window's final tally
    to `<name>-out` and late orders to its dead-letter topic."""
    return _windowed_app(bootstrap, source, state_dir, name, Aggregate(empty_tally, tally_order), "tally", settings)


def columnar_windows_app(bootstrap: str, source: str, state_dir: Path, name: str, **settings) -> App:
    """`windows_app` keeping each window's total only, with the columnar `Sum("amount")` (folded a
    consumed batch at a time in columns)."""
    return _windowed_app(bootstrap, source, state_dir, name, Sum("amount"), "total", settings)


def _windowed_app(
    bootstrap: str, source: str, state_dir: Path, name: str, aggregator: Aggregator, aggregation: str, settings: dict
) -> App:
    app = App(
        name=name,
        source=source,
        stores=["windows"],
        output=f"{name}-out",
        on_error="dead-letter",
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config={**FAST_GROUP, **settings.pop("consumer_config", {})},
        **{**FAST_COMMITS, **settings},
    )
    windows = app.dataframe().tumbling_window(WINDOW_MS, grace=WINDOW_GRACE_MS, store="windows")
    app.to_topic(windows.aggregate(aggregator, name=aggregation).final())
    return app


PAYMENT_DUE_MS = 60_000
"""How long after an order (in event time) its payment may come before the order is unpaid."""


def await_payment(event: dict, state: State) -> None:
    """An order waits for its payment (a stream-time timer); the payment cancels the wait."""
    if event["type"] == "order":
        state.set("order", event)
        state.schedule("unpaid", event["time"] + PAYMENT_DUE_MS, wall_clock=event.get("wall_clock", False))
    elif state.cancel("unpaid"):
        state.delete("order")


def unpaid(timer: Timer, state: State) -> dict:
    order = state.get("order")
    state.delete("order")
    return {"unpaid": order["id"], "due": timer.due, "wall_clock": timer.wall_clock}


def unpaid_orders_app(bootstrap: str, source: str, state_dir: Path, name: str, **settings) -> App:
    """Orders and payments keyed by order id in `source`; an order whose payment did not come within
    `PAYMENT_DUE_MS` of event time is sent to `<name>-unpaid` when its timer fires."""
    app = App(
        name=name,
        source=source,
        stores=["pending"],
        output=f"{name}-unpaid",
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config={**FAST_GROUP, **settings.pop("consumer_config", {})},
        **{**FAST_COMMITS, **settings},
    )
    frame = app.dataframe().update(await_payment, stateful=True).filter(lambda event: False)
    frame.on_timer(unpaid)
    app.to_topic(frame)
    return app


def make_orders(count: int, customers: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [
        (f"c{i % customers}".encode(), orjson.dumps({"customer": f"c{i % customers}", "amount": 1 + i % 7}))
        for i in range(start, start + count)
    ]


def expected_totals(orders: list[tuple[bytes, bytes]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for key, value in orders:
        totals[key.decode()] = totals.get(key.decode(), 0) + orjson.loads(value)["amount"]
    return totals


def orders_topic(bootstrap: str, name: str, partitions: int, orders: list[tuple[bytes, bytes]]) -> str:
    create_topic(bootstrap, name, partitions=partitions)
    produce(bootstrap, name, orders)
    return name


def running_sums(bootstrap: str, source: str) -> dict[str, list[int]]:
    """Per customer, the total after each of its orders, recomputed from the source topic."""
    sums: dict[str, list[int]] = {}
    for message in sorted(read_messages(bootstrap, source), key=lambda m: (m.partition(), m.offset())):
        if message.value() == NOT_JSON:
            continue
        order = orjson.loads(message.value())
        previous = sums.setdefault(order["customer"], [])
        previous.append((previous[-1] if previous else 0) + order["amount"])
    return sums


def outputs_per_customer(bootstrap: str, output: str, timeout: float = 30.0) -> dict[str, list[int]]:
    """Per customer, the totals of the outputs a `read_committed` reader sees, in order (every
    transaction on `output` must end within `timeout` s): `running_sums` when each appears once."""
    seen: dict[str, list[int]] = {}
    for message in sorted(read_committed(bootstrap, output, timeout), key=lambda m: (m.partition(), m.offset())):
        result = orjson.loads(message.value())
        seen.setdefault(result["customer"], []).append(result["total"])
    return seen


def checkpoint_of(directory: Path) -> Checkpoint:
    """The checkpoint of the store partition at `directory`, which must have been written."""
    checkpoint = read_checkpoint(directory)
    assert checkpoint is not None, f"no checkpoint in {directory}"
    return checkpoint


def store_content(app: App, store: str, partitions: int) -> dict[tuple[bytes, bytes], bytes]:
    """{(message key, state key): raw value} across every local partition of `store`."""
    content = {}
    for partition in range(partitions):
        part = app.state.partition(store, partition)
        part.open()
        try:
            for key, value in part.items():
                content[split_store_key(key)] = value
        finally:
            part.close()
    return content


def totals_in_store(app: App, partitions: int) -> dict[str, int]:
    return {
        message_key.decode(): orjson.loads(value)
        for (message_key, state_key), value in store_content(app, "totals", partitions).items()
        if state_key == b"total"
    }


def opened_partition(directory: StateDirectory, store: str, number: int = 0) -> Generator[StorePartition, None, None]:
    """`store`'s partition, open until the generator is closed (a fixture's `yield from`)."""
    part = directory.partition(store, number)
    part.open()
    try:
        yield part
    finally:
        part.close()
