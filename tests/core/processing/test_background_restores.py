"""A worker's full restores on the machine's other cores: a worker without local state replays some
partitions in a child process while it replays others itself, and ends with the totals recomputed
from the source under both guarantees; a child that dies hands its partitions back to the worker,
which replays them itself; a stop ends the child and leaves nothing behind, and the next worker
restores exactly. A worker without local state starts the child while it joins its group."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core import App, RestoreListener
from dagster_stateful.core.monitoring.report import StopReason
from dagster_stateful.core.processing.worker.loop import Worker
from dagster_stateful.core.recovery.restore_log import RESTORE_REPORT_FIELD

PARTITIONS = 4
CUSTOMERS = 40_000
LOGGER = "dagster_stateful.core.processing.restores.background"


def replay_children() -> list[int]:
    """Pids of this process's children that replay changelogs."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if parent == os.getpid() and b"parallel_replay" in command:
            pids.append(int(entry.name))
    return pids


def replay_directories(app: App) -> list[Path]:
    return sorted(app.state.root.rglob(".replay-*"))


class OnRestoreStart(RestoreListener):
    """Calls `action` once, when the first restore starts."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action
        self.called = threading.Event()

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None:
        if not self.called.is_set():
            self.called.set()
            self.action()


def app_with_changelog(
    bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path, guarantee: str
) -> tuple[App, list[tuple[bytes, bytes]]]:
    """An app whose changelog holds a record per customer, with its local state deleted."""
    orders = make_orders(CUSTOMERS, CUSTOMERS)
    source = orders_topic(bootstrap, unique_name("orders"), PARTITIONS, orders)
    app = totals_app(
        bootstrap, source, tmp_path, unique_name("totals"), processing_guarantee=guarantee, restore_processes=2
    )
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    assert replay_children() == [], "the process started ahead of a first start, with nothing to restore, ended"
    app.clear_state()
    return app, orders


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_worker_without_local_state_restores_on_two_cores_and_ends_exact(
    kafka_bootstrap, unique_name, tmp_path, caplog, guarantee
):
    app, orders = app_with_changelog(kafka_bootstrap, unique_name, tmp_path, guarantee)
    more = make_orders(5_000, CUSTOMERS, start=CUSTOMERS)
    produce(kafka_bootstrap, app.config.source, more)

    with caplog.at_level(logging.INFO):
        restored = app.bind().run_worker(max_seconds=120)

    assert any("in a child process" in message for message in caplog.messages), "some partitions replayed in a child"
    logged = [
        getattr(record, RESTORE_REPORT_FIELD) for record in caplog.records if hasattr(record, RESTORE_REPORT_FIELD)
    ]
    assert sorted(report.partition for report in logged) == list(range(PARTITIONS)), "each restore's end is logged"
    assert sorted(r.partition for r in restored.restores) == list(range(PARTITIONS))
    assert all(r.completed and r.kind == "full" for r in restored.restores)
    assert sum(r.records_applied for r in restored.restores) >= CUSTOMERS
    assert restored.stop_reason == "caught_up" and restored.total_processed == len(more)
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders + more)
    assert replay_directories(app) == [] and replay_children() == []


def test_a_worker_without_local_state_has_its_restore_process_running_before_the_first_restore(
    kafka_bootstrap, unique_name, tmp_path
):
    app, orders = app_with_changelog(kafka_bootstrap, unique_name, tmp_path, "at-least-once")
    running: list[list[int]] = []
    restarting = app.bind()
    restarting.add_restore_listener(OnRestoreStart(lambda: running.append(replay_children())))

    report = restarting.run_worker(max_seconds=120)

    assert len(running) == 1 and len(running[0]) == 1, "the replaying process was up when the first restore began"
    assert report.stop_reason == "caught_up"
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)
    assert replay_directories(app) == [] and replay_children() == []


def test_a_worker_that_cannot_start_a_restore_process_restores_in_its_own(
    kafka_bootstrap, unique_name, tmp_path, caplog, monkeypatch
):
    app, orders = app_with_changelog(kafka_bootstrap, unique_name, tmp_path, "at-least-once")
    unrunnable = tmp_path / "python"
    unrunnable.write_text("")  # an interpreter this user may not execute, as for a worker run as another user
    monkeypatch.setattr(sys, "executable", str(unrunnable))

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report = app.bind().run_worker(max_seconds=120)

    assert any("Cannot start a restore process" in message for message in caplog.messages), caplog.messages
    assert report.stop_reason == "caught_up"
    assert sorted(r.partition for r in report.restores if r.completed) == list(range(PARTITIONS))
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)
    assert replay_directories(app) == [] and replay_children() == []


def test_a_child_killed_mid_restore_hands_its_partitions_back_to_the_worker(
    kafka_bootstrap, unique_name, tmp_path, caplog
):
    app, orders = app_with_changelog(kafka_bootstrap, unique_name, tmp_path, "at-least-once")
    killed: list[int] = []

    def kill_the_child() -> None:
        def kill() -> None:
            wait_for(lambda: bool(replay_children()), 30, "a child replaying changelogs", interval=0.005)
            for pid in replay_children():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        threading.Thread(target=kill, daemon=True).start()

    restarting = app.bind()
    restarting.add_restore_listener(OnRestoreStart(kill_the_child))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report = restarting.run_worker(max_seconds=120)

    assert killed, "the child was killed"
    assert any("replays them itself instead" in message for message in caplog.messages)
    assert report.stop_reason == "caught_up"
    finished = [r for r in report.restores if r.completed]
    assert sorted(r.partition for r in finished) == list(range(PARTITIONS))
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)
    assert replay_directories(app) == [] and replay_children() == []


def test_a_stop_during_a_child_restore_ends_the_child_and_the_next_worker_restores_exactly(
    kafka_bootstrap, unique_name, tmp_path
):
    app, orders = app_with_changelog(kafka_bootstrap, unique_name, tmp_path, "exactly-once")
    stopping = app.bind()
    workers: list[Worker] = []
    stopping.add_restore_listener(OnRestoreStart(lambda: workers[0].stop.request()))
    worker = stopping.worker(max_seconds=120)
    workers.append(worker)

    report = worker.run()

    assert report.stop_reason == StopReason.STOP_REQUESTED
    assert any(not r.completed for r in report.restores), "a restore was suspended"
    assert replay_directories(app) == [] and replay_children() == []
    again = app.bind().run_worker(max_seconds=120)
    assert again.stop_reason == "caught_up"
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)
