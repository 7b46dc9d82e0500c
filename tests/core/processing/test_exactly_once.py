"""Exactly-once against a real broker: outputs, state and offsets commit in one Kafka transaction.

Each output is a customer's running total after one order, so a `read_committed` reader can check
that every order produced exactly one output: per customer, the outputs in order must be exactly
the running sums of that customer's amounts in the source (a doubled or missing message breaks the
sequence). Totals are recomputed from the source topic, never read from the engine's figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.core_helpers import (
    FAST_GROUP,
    NOT_JSON,
    add_to_total,
    expected_totals,
    make_orders,
    orders_topic,
    outputs_per_customer,
    running_sums,
    totals_in_store,
)
from support.kafka_helpers import create_topic, produce, read_committed

from dagster_stateful.core import App, State
from dagster_stateful.errors import ConfigurationError

ORDERS = 600
CUSTOMERS = 40


def exactly_once_app(bootstrap: str, source: str, output: str, state_dir: Path, name: str, step) -> App:
    app = App(
        on_error="dead-letter",
        name=name,
        source=source,
        output=output,
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee="exactly-once",
        commit_interval=0.5,
        commit_every=50,
        consumer_config=FAST_GROUP,
    )
    frame = app.dataframe()
    frame.apply(step, stateful=True)
    app.to_topic(frame)
    return app


def test_an_aborted_transaction_rolls_the_cache_back_and_each_output_appears_once(
    kafka_bootstrap, unique_name, tmp_path
):
    orders = make_orders(ORDERS, CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders[:100])
    produce(kafka_bootstrap, source, [(b"c1", NOT_JSON)])  # a dead letter, produced through the transactions
    produce(kafka_bootstrap, source, orders[100:])
    output = unique_name("totals-out")
    # The broker refuses records over 2,000 bytes here: the one oversized output aborts its transaction.
    create_topic(kafka_bootstrap, output, 2, {"max.message.bytes": "2000"})
    calls = [0]

    def total_with_one_oversized_output(order: dict, state: State) -> dict:
        calls[0] += 1
        result = add_to_total(order, state)
        return {**result, "padding": "x" * 5000} if calls[0] == 120 else result

    app = exactly_once_app(
        kafka_bootstrap, source, output, tmp_path, unique_name("eos"), total_with_one_oversized_output
    )
    report = app.run_worker(max_seconds=120)

    assert report.processing_guarantee == "exactly-once"
    assert report.transactions_aborted >= 1, "the oversized output aborted a transaction"
    assert report.total_processed > ORDERS, "the aborted transaction's messages were processed again"
    assert totals_in_store(app, 2) == expected_totals(orders), "the aborted work left nothing in the state"
    assert outputs_per_customer(kafka_bootstrap, output) == running_sums(kafka_bootstrap, source)
    dead_letters = read_committed(kafka_bootstrap, app.config.dead_letter_topic)
    assert [letter.value() for letter in dead_letters] == [NOT_JSON], "the dead letter appears once"
    assert report.dead_lettered >= 1


def test_a_run_pinned_to_partitions_is_refused_under_exactly_once(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, make_orders(10, 2))
    output = unique_name("totals-out")
    create_topic(kafka_bootstrap, output, 2)
    app = exactly_once_app(kafka_bootstrap, source, output, tmp_path, unique_name("eos"), add_to_total)

    with pytest.raises(ConfigurationError, match=r"pinned to partitions \[1\] cannot give"):
        app.run_worker(max_seconds=30, partitions=[1])
    assert read_committed(kafka_bootstrap, output) == [], "nothing was processed"
