"""The worker pool as Dagster runs it: one run of three member steps in parallel processes (the
multiprocess executor), each a worker with its own static membership over one shared state
directory: the group gives each member partitions of its own (the orders arrive once all three
have joined, so each has work), and the totals are exact. Each
member holds a Dagster concurrency pool of its own: with the pools limited to 1, a second pool run
launched meanwhile runs each member only once the first run's has finished (without the pools,
Kafka fences one of the two)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pool_job
import pytest
from dagster import DagsterEventType, DagsterInstance
from support.core_helpers import expected_totals, make_orders, totals_in_store
from support.kafka_helpers import create_topic, produce, wait_for

from dagster_stateful.core import App
from dagster_stateful.core.kafka.descriptions import GroupDescription
from dagster_stateful.naming import job_name, worker_pool

ORDERS = make_orders(3_000, customers=60)
POOL_WITH_STANDBYS_SECONDS = 30
"""How long each member of the pool with standbys runs: with the other host's worker, the members
must join, process the orders and tail the other host's changelogs (done about 7 s after the first
member started, on a loaded 2-core machine)."""
FIRST_RUN_SECONDS = 30
"""How long each of the first run's members runs: the three must join, own partitions and process
the orders (done about 9 s after the first member started, on a loaded 2-core machine). The second
run is launched as soon as the first holds its members' pools, while their step processes start
(5-40 s here): it is seen waiting on each pool long before the first run's members stop."""


@pytest.fixture
def pool(kafka_bootstrap, unique_name, tmp_path: Path, monkeypatch) -> App:
    """The pool test app, its source still empty; step processes find it through the environment."""
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=pool_job.PARTITIONS)
    for variable, value in {
        "POOL_TEST_APP": unique_name("pool"),
        "POOL_TEST_SOURCE": source,
        "POOL_TEST_BOOTSTRAP": kafka_bootstrap,
        "POOL_TEST_STATE": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.chdir(Path(pool_job.__file__).parent)  # where Dagster's step processes import pool_job from
    return pool_job.pool_app()


def member_config(app: App, **limits: object) -> dict:
    return {"ops": {job_name(app, f"run_worker_member_{m}_op"): {"config": limits} for m in range(pool_job.MEMBERS)}}


def test_a_pool_run_splits_the_partitions_and_a_second_run_waits_for_each_member_identity(
    pool, kafka_bootstrap, tmp_path: Path
):
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    environment = {**os.environ, "DAGSTER_HOME": str(home)}
    with DagsterInstance.from_config(str(home)) as instance:  # its storage exists before two processes open it
        first = launch(member_config(pool, max_seconds=FIRST_RUN_SECONDS, until_caught_up=False), environment)
        first_run = wait_for(
            lambda: holding_run(instance, pool_job.MEMBERS), timeout=120, what="the first run to hold every pool"
        )
        second = launch(member_config(pool, max_seconds=60, until_caught_up=True), environment)
        second_run = wait_for(lambda: other_run(instance, first_run), timeout=120, what="the second run")
        wait_for(
            lambda: len(blocked_steps(instance, second_run)) == pool_job.MEMBERS,
            timeout=120,
            what="each member of the second run to wait for its identity's pool, held by the first run's",
        )
        wait_for(
            lambda: every_member_owns_partitions(pool, kafka_bootstrap),
            timeout=120,
            what="each of the first run's members to own partitions",
        )
        produce(kafka_bootstrap, pool.source, ORDERS)
        outputs = [process.communicate(timeout=300)[0] for process in (first, second)]
        assert [first.returncode, second.returncode] == [0, 0], outputs
        spans = {run_id: step_spans(instance, run_id) for run_id in (first_run, second_run)}
        owners = partition_owners(instance, first_run)

    for member in range(pool_job.MEMBERS):
        step = job_name(pool, f"run_worker_member_{member}_op")
        assert spans[first_run][step][1] <= spans[second_run][step][0], f"{worker_pool(pool, member)} held twice"
    assert set(owners) == {str(p) for p in range(pool_job.PARTITIONS)}
    assert len({step for steps in owners.values() for step in steps}) == pool_job.MEMBERS, "every member worked"
    bound = pool.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "state")
    assert totals_in_store(bound, pool_job.PARTITIONS) == expected_totals(ORDERS)


def test_a_pool_with_standby_replicas_keeps_another_hosts_partitions_warm_and_its_materializations_say_where(
    pool, kafka_bootstrap, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("POOL_TEST_STANDBYS", "1")
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    here = pool.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "state")
    elsewhere = pool.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "elsewhere")
    elsewhere.config = elsewhere.config.replace(num_standby_replicas=1)
    other_host = elsewhere.worker(max_seconds=150, until_caught_up=False)
    thread = threading.Thread(target=other_host.run, daemon=True)
    thread.start()
    environment = {**os.environ, "DAGSTER_HOME": str(home)}
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            run = launch(
                member_config(pool, max_seconds=POOL_WITH_STANDBYS_SECONDS, until_caught_up=False), environment
            )
            group = wait_for(
                lambda: every_member_owns_partitions(pool, kafka_bootstrap, pool_job.MEMBERS + 1),
                120,
                "the pool's members and the other host's worker to own partitions",
            )
            theirs = sorted(p for m in group.members if m.client_id == elsewhere.worker_client_id for p in m.partitions)
            produce(kafka_bootstrap, pool.source, ORDERS)
            wait_for(lambda: all_committed(here), POOL_WITH_STANDBYS_SECONDS, "every order to be processed")
            wait_for(
                lambda: all(d.changelog_lag == 0 and d.changelog_high > 0 for d in here.describe_partitions(theirs)),
                POOL_WITH_STANDBYS_SECONDS,
                "the pool to keep the other host's partitions up to date here",
            )
            output = run.communicate(timeout=300)[0]
            assert run.returncode == 0, output
            materialized = store_metadata(instance, output.strip().splitlines()[-1])
    finally:
        other_host.stop.request()
        thread.join(60)

    ours = set(range(pool_job.PARTITIONS)) - set(theirs)
    assert theirs and ours <= set(materialized), materialized.keys()
    for partition in ours:
        assert materialized[partition]["active_copy"] == here.worker_client_id
        [standby] = materialized[partition]["standby_copies"]
        assert standby["member"] == elsewhere.worker_client_id, "a pool's standbys are on other hosts only"
    assert totals_in_store(here, pool_job.PARTITIONS) == expected_totals(ORDERS), "active copies and standbys"


def all_committed(app: App) -> bool:
    highs = app.kafka.watermarks(app.source, range(pool_job.PARTITIONS))
    committed = app.kafka.committed_offsets(app.consumer_group, app.source, range(pool_job.PARTITIONS))
    return all(committed[p] == highs[p][1] for p in range(pool_job.PARTITIONS))


def store_metadata(instance: DagsterInstance, run_id: str) -> dict[int, dict[str, Any]]:
    """Kafka partition -> the metadata values of the run's store materialization of it."""
    found: dict[int, dict[str, Any]] = {}
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        assert entry.dagster_event is not None
        materialization = entry.dagster_event.step_materialization_data.materialization
        if materialization.partition is not None and "active_copy" in materialization.metadata:
            found[int(materialization.partition)] = {k: v.value for k, v in materialization.metadata.items()}
    return found


def launch(run_config: dict, environment: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "pool_job.py", json.dumps(run_config)]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True)


def every_member_owns_partitions(app: App, bootstrap: str, members: int = pool_job.MEMBERS) -> GroupDescription | None:
    """The group, once it is stable with `members` members that each own partitions."""
    group = app.bind(kafka=bootstrap).kafka.describe_group(app.consumer_group, app.source)
    owners = [member for member in group.members if member.partitions]
    return group if group.state == "STABLE" and len(owners) == members else None


def other_run(instance: DagsterInstance, run_id: str) -> str | None:
    return next((run.run_id for run in instance.get_runs() if run.run_id != run_id), None)


def holding_run(instance: DagsterInstance, members: int) -> str | None:
    """The one run so far, once it holds the pools of its `members` steps: Dagster claims a step's
    pool before it launches the step's process (`STEP_WORKER_STARTING`)."""
    runs = instance.get_runs()
    if len(runs) != 1:
        return None
    launched = instance.all_logs(runs[0].run_id, of_type=DagsterEventType.STEP_WORKER_STARTING)
    return runs[0].run_id if len(launched) == members else None


def partition_owners(instance: DagsterInstance, run_id: str) -> dict[str, set[str]]:
    """Kafka partition -> the member steps of the run that materialized it (in the store: a run
    may also record its changelog's first materialization, which has no partition)."""
    owners: dict[str, set[str]] = {}
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        assert entry.dagster_event is not None
        partition = entry.dagster_event.step_materialization_data.materialization.partition
        if partition is not None:
            owners.setdefault(partition, set()).add(str(entry.step_key))
    return owners


def step_spans(instance: DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """step key -> (started, succeeded) timestamps."""
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
        target = started if entry.dagster_event_type is DagsterEventType.STEP_START else ended
        target[str(entry.step_key)] = entry.timestamp
    return {step: (started[step], ended[step]) for step in started}


def blocked_steps(instance: DagsterInstance, run_id: str) -> set[str]:
    return {
        str(entry.step_key)
        for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
        if "blocked by limit for pool" in entry.message
    }
