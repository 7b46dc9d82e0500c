"""What goes wrong in production and how the engine answers: corruption, a recreated changelog, a
committed offset lost to retention, and SIGTERM in the middle of a run."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from support.core_helpers import checkpoint_of, expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core.state.checkpoint import read_checkpoint
from dagster_stateful.errors import RecoveryError

TESTS = Path(__file__).resolve().parents[2]


def test_corrupted_store_is_moved_aside_and_fully_restored(kafka_bootstrap, unique_name, tmp_path, caplog):
    orders = make_orders(200, customers=10)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, orders)
    name = unique_name("totals")
    totals_app(kafka_bootstrap, source, tmp_path, name).run_worker(max_seconds=120)
    partition_dir = tmp_path / name / "totals" / "0"
    (partition_dir / "CURRENT").write_text("garbage-manifest\n")

    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    with caplog.at_level(logging.WARNING):
        report = app.run_worker(max_seconds=120)

    assert "is corrupted" in caplog.text and str(partition_dir) in caplog.text
    assert [r.kind for r in report.restores] == ["full"]
    assert list(partition_dir.parent.glob("0.corrupt-*")), "the damaged store is kept for inspection"
    assert totals_in_store(app, 1) == expected_totals(orders)


def test_changelog_recreated_behind_the_local_state_is_reported(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, make_orders(50, customers=5))
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    app.run_worker(max_seconds=120)
    changelog = app.changelog_topic("totals")
    app.kafka.admin().delete_topics([changelog])[changelog].result(timeout=30)
    wait_for(lambda: app.kafka.partition_count(changelog) is None, 60, f"{changelog} to be deleted")

    with pytest.raises(RecoveryError) as raised:
        totals_app(kafka_bootstrap, source, tmp_path, name).run_worker(max_seconds=60)

    message = str(raised.value)
    assert changelog in message and "beyond the end" in message and "clear" in message


def test_committed_offset_below_the_low_watermark_is_reported(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, make_orders(40, customers=4))
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    app.run_worker(max_seconds=120)
    produce(kafka_bootstrap, source, make_orders(30, customers=4, start=40))
    deleted = app.kafka.admin().delete_records([TopicPartition(source, 0, 55)])
    for future in deleted.values():
        future.result(timeout=30)

    with pytest.raises(RecoveryError) as raised:
        totals_app(kafka_bootstrap, source, tmp_path, name).run_worker(max_seconds=60)

    message = str(raised.value)
    assert f"{source}[0]" in message and "committed offset 40" in message and "low watermark 55" in message
    assert "--reset-offsets" in message


SIGTERM_WORKER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from support.core_helpers import totals_app

    app = totals_app({bootstrap!r}, {source!r}, {state_dir!r}, {name!r}, commit_every=100)
    app.dataframe().update(lambda order: time.sleep(0.003))
    report = app.run_worker(max_seconds=300)
    print(json.dumps({{"stop_reason": report.stop_reason, "committed": report.committed_offsets,
                      "processed": report.total_processed}}))
""")


def test_sigterm_stops_the_worker_cleanly(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(3000, customers=10)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, orders)
    name = unique_name("totals")
    script = SIGTERM_WORKER.format(
        tests=str(TESTS), bootstrap=kafka_bootstrap, source=source, state_dir=str(tmp_path), name=name
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    checkpoint_dir = tmp_path / name / "totals" / "0"
    try:
        wait_for(
            lambda: (checkpoint := read_checkpoint(checkpoint_dir)) and checkpoint.source_offset,
            120,
            "the first commit",
        )
        os.kill(worker.pid, signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    assert worker.returncode == 0, stderr.decode()[-2000:]
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    assert result["stop_reason"] == "stop requested (SIGTERM)"
    assert 0 < result["processed"] < len(orders)
    committed = result["committed"]["0"]
    assert committed == result["processed"] == checkpoint_of(checkpoint_dir).source_offset, (
        "everything processed before the stop was committed and checkpointed"
    )

    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    assert app.run_worker(max_seconds=120).total_processed == len(orders) - committed
    assert totals_in_store(app, 1) == expected_totals(orders)
