"""A worker's own restore takes the planner's path: with a snapshot cheaper than the replay, it loads
the snapshot and replays only the changelog tail after it."""

from __future__ import annotations

import pytest
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce

from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.spark.snapshots import build_snapshot

pytestmark = pytest.mark.spark


def test_a_worker_restores_from_a_snapshot_and_replays_only_the_tail(spark, kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(12_000, customers=40)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    name = unique_name("totals")
    # Small commits: the changelog holds many versions of each of the 40 keys, so loading the snapshot
    # (40 keys) and replaying its tail beats replaying thousands of records.
    app = totals_app(kafka_bootstrap, source, tmp_path / "state", name, commit_every=20)
    app.run_worker(max_seconds=180)
    topic = app.changelog_topic("totals")
    ends = {p: high for p, (_, high) in app.kafka.watermarks(topic, range(2)).items()}
    committed = app.kafka.committed_offsets(name, source, range(2))
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), name, "totals")
    manifest = build_snapshot(spark, {"kafka.bootstrap.servers": kafka_bootstrap}, topic, ends, committed, snapshots)
    later = make_orders(400, customers=40, start=12_000)
    produce(kafka_bootstrap, source, later)
    app.run_worker(max_seconds=120)  # the changelog grows past the snapshot: a tail to replay
    app.clear_state()  # a new machine

    restored = app.bind(snapshot_root=str(tmp_path / "snapshots"))
    report = restored.run_worker(max_seconds=120)

    kinds = {(r.partition, r.kind) for r in report.restores}
    assert kinds == {(0, "snapshot"), (1, "snapshot"), (0, "partial"), (1, "partial")}, report.restores
    tails = {r.partition: r for r in report.restores if r.kind == "partial"}
    assert all(tails[p].start_offset == manifest.end_offsets[p] for p in range(2)), "the tail starts at the snapshot"
    assert sum(r.records_applied for r in tails.values()) < sum(ends.values()) // 4
    assert report.stop_reason == "caught_up"
    assert totals_in_store(restored, 2) == expected_totals(orders + later)
