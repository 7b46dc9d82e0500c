"""Processing with state: totals are right, restarts continue, outputs and filters behave."""

from __future__ import annotations

import orjson
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, read_all


def test_totals_are_correct_after_processing(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(600, customers=17)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up"
    assert report.total_processed == 600 and report.total_lag == 0
    assert sum(report.committed_offsets.values()) == 600
    assert totals_in_store(app, 3) == expected_totals(orders)


def test_restart_continues_where_it_left_off(kafka_bootstrap, unique_name, tmp_path):
    first, second = make_orders(300, customers=5), make_orders(200, customers=5, start=300)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, first)
    name = unique_name("totals")
    assert totals_app(kafka_bootstrap, source, tmp_path, name).run_worker(max_seconds=120).total_processed == 300
    produce(kafka_bootstrap, source, second)

    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    report = app.run_worker(max_seconds=120)

    assert report.total_processed == 200, "only the new messages are processed"
    assert report.restores == [], "local state was current: nothing to restore"
    assert totals_in_store(app, 2) == expected_totals(first + second)


def test_outputs_filters_and_max_messages(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(100, customers=4)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, orders)
    output = unique_name("big-totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), output=output)
    sdf = app.dataframe().filter(lambda value: value["total"] > 100)
    app.to_topic(sdf)

    report = app.run_worker(max_messages=60, max_seconds=120)

    assert report.stop_reason == "max_messages" and report.committed_offsets == {0: 60}
    running = expected_totals([])
    emitted = []
    for key, value in orders[:60]:
        running[key.decode()] = running.get(key.decode(), 0) + orjson.loads(value)["amount"]
        if running[key.decode()] > 100:
            emitted.append((key, {"customer": key.decode(), "total": running[key.decode()]}))
    outputs = []
    for k, v in read_all(kafka_bootstrap, output):
        assert v is not None, "an output record is never a tombstone"
        outputs.append((k, orjson.loads(v)))
    assert outputs == emitted
    assert report.lag == {0: 40}


def test_a_group_without_committed_offsets_starts_where_auto_offset_reset_says(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(120, customers=6)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, orders)
    at_end = {"auto.offset.reset": "latest"}
    latest = totals_app(kafka_bootstrap, source, tmp_path / "latest", unique_name("latest"), consumer_config=at_end)
    earliest = totals_app(kafka_bootstrap, source, tmp_path / "earliest", unique_name("earliest"))

    skipped, processed = latest.run_worker(max_seconds=120), earliest.run_worker(max_seconds=120)

    assert skipped.stop_reason == "caught_up" and skipped.total_processed == 0 and skipped.total_lag == 0
    assert totals_in_store(latest, 3) == {}, "the messages before the worker started are not processed"
    assert processed.total_processed == 120 and totals_in_store(earliest, 3) == expected_totals(orders)
    later = make_orders(30, customers=6, start=120)
    produce(kafka_bootstrap, source, later)
    resumed = latest.run_worker(max_seconds=120)
    assert resumed.total_processed == 30, "the first run committed where it started: the end"
    assert totals_in_store(latest, 3) == expected_totals(later)
