"""A worker's run under the conditions a bounded worker meets in production: expired group offsets, a
transactional source, a failure while it starts."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import create_topic, produce

from dagster_stateful.core import KafkaOperationError, RecoveryError


def forget_group(bootstrap: str, group: str) -> None:
    """What `offsets.retention.minutes` does to a group left empty between bounded runs."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result(timeout=30)


def test_expired_group_offsets_resume_from_the_local_state(kafka_bootstrap, unique_name, tmp_path):
    first, later = make_orders(300, customers=10), make_orders(100, customers=10, start=300)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, first)
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    app.run_worker(max_seconds=120)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(source, 0, 200)]).values():
        future.result(timeout=30)  # retention took the oldest orders, as it does in production
    forget_group(kafka_bootstrap, name)
    produce(kafka_bootstrap, source, later)

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == len(later)
    assert report.committed_offsets == {0: 400}
    assert totals_in_store(app, 1) == expected_totals(first + later)


def test_expired_group_offsets_can_stop_the_worker_with_the_options(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, make_orders(50, customers=5))
    name = unique_name("totals")
    totals_app(kafka_bootstrap, source, tmp_path, name).run_worker(max_seconds=120)
    forget_group(kafka_bootstrap, name)

    with pytest.raises(RecoveryError) as raised:
        totals_app(kafka_bootstrap, source, tmp_path, name, missing_offsets="fail").run_worker(max_seconds=60)

    message = str(raised.value)
    assert f"{source}[0]" in message and "committed at source offset 50" in message
    assert "--reset-offsets --to-offset 50" in message and "missing_offsets='resume-from-state'" in message


def test_a_transactional_source_reports_caught_up(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(200, customers=8)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value in orders:
        producer.produce(source, key=key, value=value)
    producer.commit_transaction(30)  # the commit markers sit on offsets no message has
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))

    started = time.monotonic()
    report = app.run_worker(max_seconds=90)

    assert report.stop_reason == "caught_up", f"ran {time.monotonic() - started:.0f} s until {report.stop_reason}"
    assert report.total_processed == len(orders) and report.total_lag == 0
    assert totals_in_store(app, 2) == expected_totals(orders)


def test_a_worker_that_fails_to_start_releases_its_lock_and_signal_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    app = totals_app("127.0.0.1:9", "orders", tmp_path, "totals", consumer_config={"session.timeout.ms": "soon"})

    with pytest.raises(KafkaOperationError, match=r"session\.timeout\.ms"):
        app.run_worker(max_seconds=5)

    assert signal.getsignal(signal.SIGTERM) == before
    assert app.clear_state() == [], "no state was written, and the failed worker's lock was released"
