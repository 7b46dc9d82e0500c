"""Locks: one opener per state partition (naming the holder), and no clear_state under a running worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import wait_for

from dagster_stateful.core import AppConfig, AppState, WorkerReport
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import StateLockedError

OPEN_IN_ANOTHER_PROCESS = """
import sys
from pathlib import Path
from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.errors import StateLockedError

config = AppConfig(name="app", source="orders", stores=("totals",))
partition = StateDirectory(Path(sys.argv[1]), config, lock_timeout_seconds=0).partition("totals", 0)
try:
    partition.open()
except StateLockedError as error:
    print(f"LOCKED: {error}")
    sys.exit(3)
if len(sys.argv) > 2 and sys.argv[2] == "die-holding-it":
    print("HOLDING", flush=True)
    sys.stdin.read()  # hold the lock until the test kills this process
partition.close()
print("OPENED")
"""


def partition_at(state_dir: Path) -> StorePartition:
    return StateDirectory(state_dir, AppConfig(name="app", source="orders", stores=("totals",))).partition("totals", 0)


def open_in_another_process(state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", OPEN_IN_ANOTHER_PROCESS, str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )


def test_second_open_in_same_process_is_refused_naming_path_and_holder(tmp_path):
    holder = partition_at(tmp_path)
    holder.open()
    try:
        holder.commit([(b"k", b"v")], None, 1)
        second = partition_at(tmp_path)

        with pytest.raises(StateLockedError) as raised:
            second.open(lock_timeout=0)

        message = str(raised.value)
        assert str(holder.path) in message and f"pid {os.getpid()}" in message, message
        assert holder.get(b"k") == b"v", "the holder is unaffected by the refused open"
    finally:
        holder.close()

    reopened = partition_at(tmp_path)
    reopened.open()  # released on close
    try:
        assert reopened.get(b"k") == b"v" and reopened.source_offset == 1
    finally:
        reopened.close()


def test_open_from_another_process_is_refused_naming_holder_pid(tmp_path):
    holder = partition_at(tmp_path)
    holder.open()
    try:
        refused = open_in_another_process(tmp_path)
    finally:
        holder.close()

    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert refused.stdout.startswith("LOCKED:")
    assert f"pid {os.getpid()}" in refused.stdout and str(holder.path) in refused.stdout, refused.stdout

    after_close = open_in_another_process(tmp_path)
    assert after_close.returncode == 0, after_close.stdout + after_close.stderr
    assert after_close.stdout.strip() == "OPENED"


def test_lock_of_a_killed_holder_is_released(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", OPEN_IN_ANOTHER_PROCESS, str(tmp_path), "die-holding-it"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert process.stdout is not None, "started with stdout=PIPE"
        assert process.stdout.readline().strip() == "HOLDING"
        with pytest.raises(StateLockedError, match=f"pid {process.pid}"):
            partition_at(tmp_path).open(lock_timeout=0)
    finally:
        process.kill()
        process.wait(timeout=30)

    partition = partition_at(tmp_path)
    partition.open()  # the kernel dropped the dead holder's lock: no stale lock file blocks us
    partition.close()


def test_clear_state_is_refused_while_a_worker_runs_and_works_after(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(50, customers=5)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    running = threading.Event()
    app.add_state_listener(lambda new, _old: running.set() if new is AppState.RUNNING else None)
    worker = app.worker(max_seconds=120, until_caught_up=False)
    outcome: dict[str, WorkerReport | BaseException] = {}

    def run() -> None:
        try:
            outcome["report"] = worker.run()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="worker", daemon=True)
    thread.start()
    try:
        assert running.wait(60), "the worker never reached RUNNING"
        ends = {partition: high for partition, (_low, high) in app.kafka.watermarks(source, [0, 1]).items()}
        wait_for(
            lambda: app.kafka.committed_offsets(app.consumer_group, source, [0, 1]) == ends,
            60,
            "the running worker to commit every message",
        )
        store_dir = app.app_dir() / "totals"
        assert (store_dir / "0").is_dir() and (store_dir / "1").is_dir()

        with pytest.raises(StateLockedError) as raised:
            app.clear_state()

        assert app.name in str(raised.value) and str(app.app_dir()) in str(raised.value), str(raised.value)
        assert (store_dir / "0").is_dir() and (store_dir / "1").is_dir(), "nothing deleted under the worker"
    finally:
        worker.stop.request()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert isinstance(report, WorkerReport), report
    assert report.total_processed == len(orders)
    assert app.listeners.current is AppState.NOT_RUNNING

    deleted = app.clear_state()

    assert deleted == [store_dir] and not store_dir.exists()

    # Cleared state is rebuilt from the changelog on the next run.
    again = totals_app(kafka_bootstrap, source, tmp_path, app.name)
    report = again.run_worker(max_seconds=60)
    assert report.stop_reason == "caught_up" and report.total_processed == 0
    assert {restore.kind for restore in report.restores} == {"full"}
    assert totals_in_store(again, 2) == expected_totals(orders)


def test_an_opener_that_finds_a_standby_holding_the_lock_asks_it_to_hand_over(tmp_path):
    standby = partition_at(tmp_path)
    standby.open(as_standby=True)
    try:
        active = partition_at(tmp_path)
        with pytest.raises(StateLockedError):
            active.open(lock_timeout=0)
        assert standby.handover_requested, "the refused opener asked the holder to hand over"
        with pytest.raises(StateLockedError):
            partition_at(tmp_path).open(lock_timeout=0, as_standby=True)
    finally:
        standby.close()

    active.open(lock_timeout=0)
    try:
        assert not active.handover_requested, "taken over: the request is gone"
    finally:
        active.close()


def kept_by_standby(partition: StorePartition) -> bool:
    checkpoint = partition.read_checkpoint()
    assert checkpoint is not None, f"no checkpoint in {partition.path}"
    return checkpoint.kept_by_standby


def test_an_active_opener_knows_when_a_standby_of_its_state_directory_kept_the_copy_it_takes(tmp_path):
    first = partition_at(tmp_path)
    first.open()
    first.finish_restore(changelog_offset=5, source_offset=10)
    first.close()
    assert not kept_by_standby(first)

    standby = partition_at(tmp_path)
    standby.open(as_standby=True)
    assert kept_by_standby(standby), "a standby's checkpoint says so from its open"
    standby.finish_restore(changelog_offset=8, source_offset=12)
    standby.close()

    taker = partition_at(tmp_path)
    taker.open()
    try:
        assert taker.kept_by_standby and taker.changelog_offset == 8
        taker.finish_restore(changelog_offset=9, source_offset=13)
        assert not kept_by_standby(taker), "once active, its checkpoints are an active's"
    finally:
        taker.close()

    again = partition_at(tmp_path)
    again.open()
    try:
        assert not again.kept_by_standby, "the active kept it last"
    finally:
        again.close()
