"""A worker pool job that Dagster can rebuild in each of its step processes (`reconstructable`),
for tests/dagster/test_pool_job.py: the app and its resources come from environment variables the
test sets before it launches the run (`POOL_TEST_STANDBYS`: the pool's standby replicas). Run as a
script, it executes one run of the job with the run config given as JSON, on the instance of
`DAGSTER_HOME`, and prints the run's id."""

from __future__ import annotations

import json
import os
import sys
import time

from dagster import DagsterInstance, JobDefinition, execute_job, reconstructable

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App, State
from dagster_stateful.naming import job_name
from dagster_stateful.resources import KafkaResource, StateStoreResource

PARTITIONS = 6
MEMBERS = 3


def slow_total(order: dict, state: State) -> dict:
    time.sleep(0.002)
    state.set("total", state.get("total", 0) + order["amount"])
    return order


def pool_app() -> App:
    app = App(
        name=os.environ["POOL_TEST_APP"],
        source=os.environ["POOL_TEST_SOURCE"],
        stores=["totals"],
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        commit_interval=0.5,
    )
    app.dataframe().apply(slow_total, stateful=True)
    return app


def pool_worker_job() -> JobDefinition:
    app = pool_app()
    defs = build_stateful_definitions(
        app,
        PARTITIONS,
        KafkaResource(bootstrap_servers=os.environ["POOL_TEST_BOOTSTRAP"]),
        StateStoreResource(state_dir=os.environ["POOL_TEST_STATE"]),
        pool_size=MEMBERS,
        standby_replicas=int(os.environ.get("POOL_TEST_STANDBYS") or 0) or None,
    )
    return defs.resolve_job_def(job_name(app, "worker"))


if __name__ == "__main__":
    with (
        DagsterInstance.get() as instance,
        execute_job(reconstructable(pool_worker_job), instance, run_config=json.loads(sys.argv[1])) as result,
    ):
        sys.stdout.write(result.run_id + "\n")
        sys.exit(0 if result.success else 1)
