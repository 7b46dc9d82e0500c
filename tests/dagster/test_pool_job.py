"""The worker pool as Dagster runs it: one run of three member steps in parallel processes (the
multiprocess executor), each a worker with its own static membership over one shared state
directory: the group gives each member partitions of its own, and the totals are exact. Each
member holds a Dagster concurrency pool of its own: with the pools limited to 1, two pool runs
launched at once never run one member identity at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pool_job
import pytest
from core_helpers import expected_totals, make_orders, orders_topic, totals_in_store
from dagster import DagsterEventType, DagsterInstance, execute_job, reconstructable

from dagster_stateful.core import App
from dagster_stateful.naming import job_name, worker_pool

ORDERS = make_orders(3_000, customers=60)


@pytest.fixture
def pool(kafka_bootstrap, unique_name, tmp_path: Path, monkeypatch) -> App:
    """The pool test app, its source filled with ORDERS; step processes find it through the environment."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), pool_job.PARTITIONS, ORDERS)
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


def test_a_pool_run_splits_the_partitions_between_its_member_steps(pool, kafka_bootstrap, tmp_path: Path):
    run_config = member_config(pool, max_seconds=20, until_caught_up=False)  # long enough for all to join

    (tmp_path / "dagster").mkdir()
    with (
        DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance,
        execute_job(reconstructable(pool_job.pool_worker_job), instance, run_config=run_config) as result,
    ):
        assert result.success
        materialized = [
            (str(event.step_key), str(event.step_materialization_data.materialization.partition))
            for event in result.all_events
            if event.is_step_materialization
        ]

    owners: dict[str, set[str]] = {}
    for step, partition in materialized:
        owners.setdefault(partition, set()).add(step)
    assert set(owners) == {str(p) for p in range(pool_job.PARTITIONS)}
    steps = {step for step, _ in materialized}
    assert len(steps) == pool_job.MEMBERS, "every member worked on partitions"
    bound = pool.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "state")
    assert totals_in_store(bound, pool_job.PARTITIONS) == expected_totals(ORDERS)


def test_two_pool_runs_at_once_never_run_one_member_identity_twice(pool, kafka_bootstrap, tmp_path: Path):
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    environment = {**os.environ, "DAGSTER_HOME": str(home)}
    run_config = json.dumps(member_config(pool, max_seconds=60, until_caught_up=True))
    with DagsterInstance.from_config(str(home)):
        pass  # the instance's storage exists before two processes open it at once

    launched = [
        subprocess.Popen(
            [sys.executable, "pool_job.py", run_config], env=environment, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300)[0] for process in launched]

    assert [process.returncode for process in launched] == [0, 0], outputs
    run_ids = [output.strip().splitlines()[-1] for output in outputs]
    with DagsterInstance.from_config(str(home)) as instance:
        spans = {run_id: step_spans(instance, run_id) for run_id in run_ids}
        blocked = blocked_steps(instance, run_ids)
    for member in range(pool_job.MEMBERS):
        step = job_name(pool, f"run_worker_member_{member}_op")
        first, second = sorted(spans[run_id][step] for run_id in run_ids)
        assert first[1] <= second[0], f"{step} ran in both runs at once ({worker_pool(pool, member)})"
    assert blocked, "a step waited for its pool, so the two runs did overlap in time"
    bound = pool.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "state")
    assert totals_in_store(bound, pool_job.PARTITIONS) == expected_totals(ORDERS)


def step_spans(instance: DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """step key -> (started, succeeded) timestamps."""
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
        target = started if entry.dagster_event_type is DagsterEventType.STEP_START else ended
        target[str(entry.step_key)] = entry.timestamp
    return {step: (started[step], ended[step]) for step in started}


def blocked_steps(instance: DagsterInstance, run_ids: list[str]) -> list[str]:
    return [
        str(entry.step_key)
        for run_id in run_ids
        for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
        if "blocked by limit for pool" in entry.message
    ]
