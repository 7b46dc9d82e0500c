"""The snapshot job on a real Spark standalone cluster: `dagster-stateful spark start --workers 2`
starts a master and two workers (executors in their own JVMs, Python workers of their own), the
`python -m dagster_stateful.spark snapshot` entry point runs the job against it, and the snapshot
holds exactly what the same job builds on the test session's `local[2]`; `stop` leaves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from core_helpers import make_orders, orders_topic, totals_app

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.recovery.snapshots import SnapshotStore
from dagster_stateful.spark.snapshots import snapshot_changelog

pytestmark = pytest.mark.spark
PARTITIONS = 3


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagster_stateful.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


def rows(snapshots: SnapshotStore, snapshot_id: str) -> dict[tuple[int, bytes], bytes]:
    found = {}
    for partition in range(PARTITIONS):
        for keys, values in snapshots.read_partition(snapshot_id, partition):
            found.update({(partition, key): value for key, value in zip(keys, values, strict=True)})
    return found


def spark_processes(home: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if str(home) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


def test_the_snapshot_job_on_a_standalone_cluster_equals_the_local_one(spark, kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, make_orders(3_000, 400))
    app = totals_app(kafka_bootstrap, source, tmp_path / "state", unique_name("cluster"), commit_every=97)
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    topic = app.changelog_topic("totals")
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    local = SnapshotStore(str(tmp_path / "local"), app.name, "totals")
    on_local = snapshot_changelog(
        spark, kafka, {"kafka.bootstrap.servers": kafka_bootstrap}, app.consumer_group, source, topic, local
    )
    home = tmp_path / "spark"

    started = cli("spark", "start", "--workers", "2", "--home", str(home))
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        master = started.stdout.strip()
        assert master.startswith("spark://127.0.0.1:")
        assert cli("spark", "status", "--home", str(home)).stdout.startswith(f"running: {master} (2 of 2 workers")
        submitted = subprocess.run(
            [
                sys.executable,
                "-m",
                "dagster_stateful.spark",
                "snapshot",
                f"--master={master}",
                f"--bootstrap={kafka_bootstrap}",
                f"--app={app.name}",
                "--store=totals",
                f"--group={app.consumer_group}",
                f"--source={source}",
                f"--changelog-topic={topic}",
                f"--snapshot-root={tmp_path / 'cluster'}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        manifest = json.loads(submitted.stdout.strip().splitlines()[-1])
        executors = list((home / "worker-0").glob("app-*")) + list((home / "worker-1").glob("app-*"))
        assert executors, "the job ran in the cluster's workers"
    finally:
        stopped = cli("spark", "stop", "--home", str(home))
    assert stopped.returncode == 0
    assert cli("spark", "status", "--home", str(home)).returncode == 3
    assert not spark_processes(home), "no Spark process outlives stop"

    on_cluster = SnapshotStore(str(tmp_path / "cluster"), app.name, "totals")
    assert {int(p): o for p, o in manifest["end_offsets"].items()} == on_local.manifest.end_offsets
    assert rows(on_cluster, manifest["snapshot_id"]) == rows(local, on_local.manifest.snapshot_id)
    assert sum(manifest["key_counts"].values()) == 400
