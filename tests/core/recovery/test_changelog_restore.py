"""Recovery from the changelog: partial and full restores, tombstones, and a worker killed mid-batch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
from support.core_helpers import (
    checkpoint_of,
    expected_totals,
    make_orders,
    orders_topic,
    store_content,
    totals_app,
    totals_in_store,
)
from support.kafka_helpers import produce, read_keyed, wait_for

from dagster_stateful.core import App, RestoreListener, State
from dagster_stateful.core.state.checkpoint import read_checkpoint
from dagster_stateful.core.state.keys import split_store_key

TESTS = Path(__file__).resolve().parents[2]


class RecordingListener(RestoreListener):
    def __init__(self) -> None:
        self.started: dict[int, tuple[int, int]] = {}
        self.restored: dict[int, int] = {}
        self.batches = 0

    def on_restore_start(self, partition, store, start_offset, end_offset):
        self.started[partition] = (start_offset, end_offset)

    def on_batch_restored(self, partition, store, batch_end_offset, num_restored):
        self.batches += 1

    def on_restore_end(self, partition, store, total_restored):
        self.restored[partition] = total_restored


def changelog_latest(bootstrap: str, app: App, store: str) -> dict[tuple[bytes, bytes], bytes]:
    latest: dict[bytes, bytes | None] = {}
    for key, value in read_keyed(bootstrap, app.changelog_topic(store)):
        latest[key] = value
    return {split_store_key(key): value for key, value in latest.items() if value is not None}


def test_partial_restore_replays_only_the_tail_and_full_restore_rebuilds(kafka_bootstrap, unique_name, tmp_path):
    first, second = make_orders(400, customers=20), make_orders(300, customers=20, start=400)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, first)
    name = unique_name("totals")
    machine_a, machine_b = tmp_path / "a", tmp_path / "b"
    totals_app(kafka_bootstrap, source, machine_a, name).run_worker(max_seconds=120)
    checkpoints_a = {p: checkpoint_of(machine_a / name / "totals" / str(p)) for p in (0, 1)}
    # Another machine takes over, restores fully, and moves the changelog on.
    produce(kafka_bootstrap, source, second)
    report_b = totals_app(kafka_bootstrap, source, machine_b, name).run_worker(max_seconds=120)
    assert {r.kind for r in report_b.restores} == {"full"} and report_b.total_processed == 300
    ends = app_changelog_ends(kafka_bootstrap, name, source, machine_b)

    listener = RecordingListener()
    app = totals_app(kafka_bootstrap, source, machine_a, name)
    app.add_restore_listener(listener)
    report = app.run_worker(max_seconds=120)

    assert report.total_processed == 0
    assert {r.kind for r in report.restores} == {"partial"}
    for partition in (0, 1):
        changelog_offset = checkpoints_a[partition].changelog_offset
        assert changelog_offset is not None, "the first run checkpointed a changelog offset"
        assert listener.started[partition] == (changelog_offset, ends[partition])
        tail = ends[partition] - changelog_offset
        assert 0 < listener.restored[partition] <= tail, "only the tail is replayed"
    assert totals_in_store(app, 2) == expected_totals(first + second)

    shutil.rmtree(machine_a / name)
    full = RecordingListener()
    app = totals_app(kafka_bootstrap, source, machine_a, name)
    app.add_restore_listener(full)
    report = app.run_worker(max_seconds=120)
    assert {r.kind for r in report.restores} == {"full"}
    assert all(start == 0 for start, _ in full.started.values())
    assert totals_in_store(app, 2) == expected_totals(first + second)


def app_changelog_ends(bootstrap: str, name: str, source: str, state_dir: Path) -> dict[int, int]:
    app = totals_app(bootstrap, source, state_dir, name)
    return {p: high for p, (_, high) in app.kafka.watermarks(app.changelog_topic("totals"), [0, 1]).items()}


def upsert_or_delete(event: dict, state: State) -> dict:
    if event.get("delete"):
        state.delete("profile")
    else:
        state.set("profile", event)
    return event


def test_tombstones_delete_keys_in_the_store_and_the_compacted_changelog(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(
        kafka_bootstrap,
        unique_name("profiles"),
        1,
        [(f"u{i}".encode(), orjson.dumps({"name": f"user {i}"})) for i in range(6)],
    )
    produce(kafka_bootstrap, source, [(f"u{i}".encode(), orjson.dumps({"delete": True})) for i in (1, 3)])
    compaction = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}

    def make_app() -> App:
        app = App(
            name=name,
            source=source,
            stores=["profiles"],
            state_dir=tmp_path,
            kafka=kafka_bootstrap,
            changelog_config=compaction,
            commit_interval=0.5,
        )
        app.dataframe().update(upsert_or_delete, stateful=True)
        return app

    name = unique_name("profiles")
    app = make_app()
    app.run_worker(max_seconds=120)
    kept = {f"u{i}".encode() for i in (0, 2, 4, 5)}
    assert set(store_content(app, "profiles", 1)) == {(k, b"profile") for k in kept}
    changelog = read_keyed(kafka_bootstrap, app.changelog_topic("profiles"))
    assert [split_store_key(k)[0] for k, v in changelog if v is None] == [b"u1", b"u3"], "deletes are tombstones"

    # One more write after segment.ms rolls the changelog's active segment so the cleaner can act.
    time.sleep(0.3)  # past the changelog's segment.ms
    produce(kafka_bootstrap, source, [(b"u9", orjson.dumps({"name": "user 9"}))])
    make_app().run_worker(max_seconds=120)

    def compacted() -> bool:
        records = [(split_store_key(k)[0], v) for k, v in read_keyed(kafka_bootstrap, app.changelog_topic("profiles"))]
        return all([v for k, v in records if k == deleted] in ([None], []) for deleted in (b"u1", b"u3"))

    wait_for(compacted, 90, "the cleaner to drop the deleted keys' values from the changelog", interval=1.0)
    shutil.rmtree(tmp_path / name)
    app = make_app()
    app.run_worker(max_seconds=120)
    assert set(store_content(app, "profiles", 1)) == {(k, b"profile") for k in kept | {b"u9"}}


KILLABLE_WORKER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from support.core_helpers import totals_app
    from dagster_stateful.core import State

    def slow_count(order, state: State):
        time.sleep(0.002)
        state.set("count", state.get("count", 0) + 1)
        return order

    # A short session (the apps' is 6 s): the worker after the kill joins once the group dropped this one.
    app = totals_app(
        {bootstrap!r}, {source!r}, {state_dir!r}, {name!r}, commit_every=150,
        consumer_config={{"session.timeout.ms": 1500, "heartbeat.interval.ms": 250}},
    )
    app.dataframe().update(slow_count, stateful=True)
    app.run_worker(max_seconds=300)
""")


def test_worker_killed_mid_batch_recovers_without_losing_a_message(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(3000, customers=25)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    name = unique_name("totals")
    script = KILLABLE_WORKER.format(
        tests=str(TESTS), bootstrap=kafka_bootstrap, source=source, state_dir=str(tmp_path), name=name
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def committed_some() -> bool:
            if worker.poll() is not None:
                assert worker.stderr is not None, "started with stderr=PIPE"
                raise AssertionError(f"the worker exited early: {worker.stderr.read().decode()[-2000:]}")
            checkpoints = [read_checkpoint(tmp_path / name / "totals" / str(p)) for p in (0, 1)]
            return sum(c.source_offset or 0 for c in checkpoints if c) >= 600

        wait_for(committed_some, 120, "the worker to commit a few batches")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    committed_before = json.dumps({p: checkpoint_of(tmp_path / name / "totals" / str(p)).source_offset for p in (0, 1)})

    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    app.dataframe().update(lambda order, state: state.set("count", state.get("count", 0) + 1), stateful=True)
    report = app.run_worker(max_seconds=180)

    assert report.stop_reason == "caught_up", committed_before
    counts = {mk.decode(): orjson.loads(v) for (mk, sk), v in store_content(app, "totals", 2).items() if sk == b"count"}
    expected_counts = dict.fromkeys(expected_totals(orders), 0)
    for key, _ in orders:
        expected_counts[key.decode()] += 1
    assert all(counts[c] >= expected_counts[c] for c in expected_counts), "every message counted at least once"
    assert totals_in_store(app, 2) == expected_totals(orders)
    assert store_content(app, "totals", 2) == changelog_latest(kafka_bootstrap, app, "totals")
