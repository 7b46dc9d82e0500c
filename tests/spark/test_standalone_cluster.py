"""The Spark jobs on a real Spark standalone cluster: `dagster-stateful spark start --workers 1`
starts a master and a worker (executors in their own JVMs, Python workers of their own); the
Dagster snapshot asset and Spark restore launch `python -m dagster_stateful.spark` against it
through Dagster Pipes, with snapshots under a URI, so the executors' SST files reach the restoring
worker through the snapshot location rather than a shared mount. The snapshot holds exactly the
worker's store (which other tests check against a changelog replay on `local[*]`), the store
restored from it equals the worker's key for key, and `stop` leaves nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from support.core_helpers import make_orders, orders_topic, totals_app

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.pipes import SparkPipesResource
from dagster_stateful.resources import KafkaResource, StateStoreResource

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


def stored(app: App) -> dict[tuple[int, bytes], bytes]:
    """(partition, raw key) -> raw value of every local partition of the store, as a snapshot holds them."""
    found = {}
    for partition in range(PARTITIONS):
        part = app.state.partition("totals", partition)
        part.open()
        try:
            found.update({(partition, key): value for key, value in part.items()})
        finally:
            part.close()
    return found


def test_the_spark_jobs_on_a_standalone_cluster_through_pipes(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, make_orders(3_000, 400))
    app = totals_app(kafka_bootstrap, source, tmp_path / "state", unique_name("cluster"), commit_every=97)
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    marks = app.kafka.watermarks(app.changelog_topic("totals"), range(PARTITIONS))
    changelog_ends = {p: high for p, (_, high) in marks.items()}
    home = tmp_path / "spark"
    # A URI: the executors upload their SST files and the restoring worker downloads them, sharing no mount.
    snapshot_root = f"file://{tmp_path / 'cluster'}"

    started = cli("spark", "start", "--workers", "1", "--home", str(home))
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        master = started.stdout.strip()
        assert master.startswith("spark://127.0.0.1:")
        assert cli("spark", "status", "--home", str(home)).stdout.startswith(f"running: {master} (1 of 1 workers")
        kafka_resource = KafkaResource(bootstrap_servers=kafka_bootstrap)
        state_store = StateStoreResource(state_dir=str(tmp_path / "restored"), snapshot_root=snapshot_root)
        resources = {
            "kafka": kafka_resource,
            "state_store": state_store,
            "spark": SparkPipesResource(master=master, cores=2),
        }
        defs = build_stateful_definitions(app, PARTITIONS, kafka_resource, state_store)
        snapshot = materialize([defs.get_assets_def(snapshot_key(app, "totals"))], resources=resources)
        restore = defs.resolve_job_def(job_name(app, "spark_restore")).execute_in_process(
            instance=DagsterInstance.ephemeral(),
            resources=resources,
            run_config={
                "ops": {job_name(app, "spark_restore_op"): {"config": {"partitions": [0, 1, 2], "method": "spark"}}}
            },
        )
        executors = list((home / "worker-0").glob("app-*"))
        assert len(executors) >= 2, "both jobs ran in the cluster's worker"
    finally:
        stopped = cli("spark", "stop", "--home", str(home))
    assert stopped.returncode == 0
    assert cli("spark", "status", "--home", str(home)).returncode == 3
    assert not spark_processes(home), "no Spark process outlives stop"

    [materialized] = snapshot.asset_materializations_for_node(job_name(app, "snapshots"))
    snapshot_id = str(materialized.metadata["snapshot_id"].value)
    on_cluster = SnapshotStore(snapshot_root, app.name, "totals")
    latest = on_cluster.latest()
    assert latest is not None and latest.end_offsets == changelog_ends, "every record was committed"
    assert rows(on_cluster, snapshot_id) == stored(app), "the snapshot holds the worker's store, key for key"
    assert materialized.metadata["keys"].value == 400

    assert restore.success
    restored = restore.asset_materializations_for_node(job_name(app, "spark_restore_op"))
    assert {m.metadata["restore_path"].value for m in restored} == {"spark"}
    here = state_store.bind(app, kafka_resource)
    assert stored(here) == stored(app)
    staged = [path for path in (tmp_path / "cluster").rglob("*.sst") if "_sst" in path.parent.parts]
    assert not staged, "staged SST files are deleted after the restore"
    assert latest.sst_image and all(
        (Path(on_cluster.image_location(snapshot_id).removeprefix("file://")) / name).is_file()
        for names in latest.sst_image.values()
        for name in names
    ), "the cluster's executors wrote the snapshot's SST image"
