"""Restores run in the worker's loop, never inside a rebalance callback: the worker keeps polling (no
eviction during a long restore), restored partitions process while others restore, and a stop or a
revocation interrupts a restore without losing its progress. The workers here restore in their
own process (`restore_processes=1`); test_background_restores covers restores in child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
from confluent_kafka import Producer
from support.core_helpers import expected_totals, totals_app, totals_in_store
from support.kafka_helpers import create_topic, wait_for

from dagster_stateful.core import App, RestoreListener, WorkerReport
from dagster_stateful.core.processing.worker.loop import Worker

TESTS = Path(__file__).resolve().parents[2]
RESTORE_BATCH = 50


class SlowRestore(RestoreListener):
    """Makes each restored batch of the chosen partitions take `delay` seconds, and records progress."""

    def __init__(self, delay: float, partitions: set[int] | None = None) -> None:
        self.delay = delay
        self.partitions = partitions
        self.batches: dict[int, int] = {}
        self.ended: set[int] = set()

    def on_batch_restored(self, partition: int, store: str, batch_end_offset: int, num_restored: int) -> None:
        self.batches[partition] = self.batches.get(partition, 0) + 1
        if self.partitions is None or partition in self.partitions:
            time.sleep(self.delay)

    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None:
        self.ended.add(partition)


def produce_to(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    """(partition, key, value) records, each to its own partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def orders_on(
    partition: int, count: int, customers: int, prefix: str, start: int = 0
) -> list[tuple[int, bytes, bytes]]:
    return [
        (partition, key, value)
        for key, value in (
            (
                f"{prefix}{i % customers}".encode(),
                orjson.dumps({"customer": f"{prefix}{i % customers}", "amount": 1 + i % 7}),
            )
            for i in range(start, start + count)
        )
    ]


def with_state_built(bootstrap: str, source: str, state_dir: Path, name: str) -> App:
    """An app whose changelog holds a few thousand records and whose local state is then deleted."""
    app = totals_app(bootstrap, source, state_dir, name, restore_batch_size=RESTORE_BATCH, restore_processes=1)
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    app.clear_state()
    return app


def run_in_thread(app: App, results: dict[str, object], label: str, **limits) -> tuple[threading.Thread, Worker]:
    worker = app.worker(**limits)

    def run() -> None:
        try:
            results[label] = worker.run()
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertions
            results[label] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, worker


def test_a_restore_longer_than_the_poll_interval_survives_a_join_and_leave(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=2)
    records = orders_on(0, 3000, 3000, "a") + orders_on(1, 3000, 3000, "b")
    produce_to(kafka_bootstrap, source, records)
    name = unique_name("totals")
    with_state_built(kafka_bootstrap, source, tmp_path / "a", name)
    poll_limit = {"max.poll.interval.ms": 10_000}
    app_a = totals_app(
        kafka_bootstrap,
        source,
        tmp_path / "a",
        name,
        restore_batch_size=RESTORE_BATCH,
        restore_processes=1,
        consumer_config=poll_limit,
    )
    slow_a = SlowRestore(delay=0.15)  # 120 batches: the restore takes about 18 s, longer than the poll limit
    app_a.add_restore_listener(slow_a)
    app_b = totals_app(
        kafka_bootstrap,
        source,
        tmp_path / "b",
        name,
        restore_batch_size=RESTORE_BATCH,
        restore_processes=1,
        consumer_config=poll_limit,
    )
    app_b.add_restore_listener(SlowRestore(delay=0.15))
    results: dict[str, object] = {}

    thread_a, _ = run_in_thread(app_a, results, "a", max_seconds=180)
    wait_for(lambda: sum(slow_a.batches.values()) >= 10, 60, "A to be well into its restore")
    thread_b, worker_b = run_in_thread(app_b, results, "b", max_seconds=180, until_caught_up=False)
    wait_for(lambda: worker_b.report.rebalances >= 1, 60, "B to join the group and take a partition")
    worker_b.stop.request()  # B leaves mid-restore; its partition goes back to A
    thread_b.join(60)
    thread_a.join(180)

    report_a = results["a"]
    assert isinstance(report_a, WorkerReport), report_a
    assert isinstance(results["b"], WorkerReport), results["b"]
    assert report_a.stop_reason == "caught_up"
    assert report_a.partitions_lost == 0, "A was never evicted from the group while it restored"
    assert report_a.rebalances >= 3, "A saw its assignment, B's join and B's leave"
    expected = expected_totals([(key, value) for _, key, value in records])
    assert totals_in_store(app_a, 2) == expected


SIGTERMED_RESTORE = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from support.core_helpers import totals_app
    from dagster_stateful.core import RestoreListener

    class Slow(RestoreListener):
        def on_batch_restored(self, partition, store, batch_end_offset, num_restored):
            print("BATCH", partition, batch_end_offset, flush=True)
            time.sleep(0.1)

    app = totals_app({bootstrap!r}, {source!r}, {state_dir!r}, {name!r}, restore_batch_size={batch},
                     restore_processes=1)
    app.add_restore_listener(Slow())
    report = app.run_worker(max_seconds=300)
    print(json.dumps({{"stop_reason": report.stop_reason, "processed": report.total_processed,
                      "restores": [[r.partition, r.start_offset, r.end_offset, r.completed]
                                   for r in report.restores]}}), flush=True)
""")


def test_sigterm_mid_restore_stops_within_seconds_and_the_next_run_continues(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=1)
    records = orders_on(0, 4000, 4000, "c")
    produce_to(kafka_bootstrap, source, records)
    name = unique_name("totals")
    with_state_built(kafka_bootstrap, source, tmp_path, name)
    script = SIGTERMED_RESTORE.format(
        tests=str(TESTS),
        bootstrap=kafka_bootstrap,
        source=source,
        state_dir=str(tmp_path),
        name=name,
        batch=RESTORE_BATCH,
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        batches = 0
        while batches < 5:
            line = worker.stdout.readline()
            assert line, f"the worker exited before restoring: {worker.stderr.read() if worker.stderr else ''}"
            batches += line.startswith("BATCH")
        signalled = time.monotonic()
        os.kill(worker.pid, signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=30)
        stopped_after = time.monotonic() - signalled
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    assert worker.returncode == 0, stderr[-2000:]
    assert stopped_after < 10, f"the worker took {stopped_after:.1f} s to stop"
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["stop_reason"] == "stop requested (SIGTERM)" and result["processed"] == 0
    [[_, first_start, end, completed]] = result["restores"]
    assert not completed and first_start == 0

    app = totals_app(kafka_bootstrap, source, tmp_path, name, restore_batch_size=1000, restore_processes=1)
    report = app.run_worker(max_seconds=120)

    [restore] = report.restores
    assert restore.kind == "partial" and 0 < restore.start_offset < end, "the next run continued the restore"
    assert restore.completed and report.stop_reason == "caught_up"
    assert totals_in_store(app, 1) == expected_totals([(key, value) for _, key, value in records])


def test_a_restored_partition_processes_while_another_restores(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=2)
    first = orders_on(0, 50, 10, "small") + orders_on(1, 4000, 4000, "big")
    produce_to(kafka_bootstrap, source, first)
    name = unique_name("totals")
    with_state_built(kafka_bootstrap, source, tmp_path, name)
    app = totals_app(kafka_bootstrap, source, tmp_path, name, restore_batch_size=RESTORE_BATCH, restore_processes=1)
    slow = SlowRestore(delay=0.2, partitions={1})  # partition 1 needs 80 slow batches: about 16 s
    app.add_restore_listener(slow)
    results: dict[str, object] = {}
    thread, worker = run_in_thread(app, results, "worker", max_seconds=180)

    wait_for(lambda: 0 in slow.ended, 60, "partition 0's small restore to end")
    more = orders_on(0, 30, 10, "small", start=50)
    produce_to(kafka_bootstrap, source, more)
    wait_for(lambda: worker.report.committed_offsets.get(0) == 80, 60, "partition 0 to process its new orders")
    assert 1 not in slow.ended, "partition 1 was still restoring while partition 0 processed"
    thread.join(180)

    report = results["worker"]
    assert isinstance(report, WorkerReport), report
    assert report.stop_reason == "caught_up" and {r.partition for r in report.restores if r.completed} == {0, 1}
    assert totals_in_store(app, 2) == expected_totals([(key, value) for _, key, value in first + more])
