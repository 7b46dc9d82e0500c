"""The worker pool as Dagster runs it: one run of three member steps in parallel processes (the
multiprocess executor), each a worker with its own static membership over one shared state
directory: the group gives each member partitions of its own, and the totals are exact."""

from __future__ import annotations

from pathlib import Path

import pool_job
from core_helpers import expected_totals, make_orders, orders_topic, totals_in_store
from dagster import DagsterInstance, execute_job, reconstructable

from dagster_stateful.naming import job_name


def test_a_pool_run_splits_the_partitions_between_its_member_steps(
    kafka_bootstrap, unique_name, tmp_path: Path, monkeypatch
):
    orders = make_orders(3_000, customers=60)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), pool_job.PARTITIONS, orders)
    name = unique_name("pool")
    for variable, value in {
        "POOL_TEST_APP": name,
        "POOL_TEST_SOURCE": source,
        "POOL_TEST_BOOTSTRAP": kafka_bootstrap,
        "POOL_TEST_STATE": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.chdir(Path(pool_job.__file__).parent)  # where Dagster's step processes import pool_job from
    app = pool_job.pool_app()
    limits = {"config": {"max_seconds": 20, "until_caught_up": False}}  # long enough for all to join
    run_config = {
        "ops": {job_name(app, f"run_worker_member_{member}_op"): limits for member in range(pool_job.MEMBERS)}
    }

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
    bound = app.bind(kafka=kafka_bootstrap, state_dir=tmp_path / "state")
    assert totals_in_store(bound, pool_job.PARTITIONS) == expected_totals(orders)
