"""Shared fixtures: one real Kafka broker, one secured broker (started only when a test asks for it)
and one local Spark session per test session.

When KAFKA_BOOTSTRAP_SERVERS is set, tests use that cluster and start no broker. Every test
makes its own uniquely named topics and consumer groups (`unique_name`), so tests never see each
other's data. Tests that need a broker, Spark, Dagster processes or a browser are marked
`integration`; the others form the fast tier (`-m "not integration"`), which runs first. Under
pytest-xdist (`-n 2 --dist loadgroup`, as scripts/test runs the integration tier) each worker
process starts its own broker when one of its tests asks, and every test is put in a group that
runs on one worker (`_run_group`).
"""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker
from dagster_stateful.local_kafka.secured import SecuredEndpoints

TESTS = Path(__file__).resolve().parent
INTEGRATION_FIXTURES = {"kafka_bootstrap", "secured_kafka", "spark"}
INTEGRATION_DIRS = {"local_kafka", "dagster", "spark"}
"""Tests here start brokers, Spark, Dagster processes or a browser of their own."""


SPARK_GROUP = "spark"
"""The `xdist_group` of every test that uses the Spark session, so that one worker starts it."""
WAITS_GROUP = "waits"
WAITING_MODULES = {
    "core/kafka/test_broker_outage.py",
    "core/processing/test_bounded_worker.py",
    "core/processing/test_exactly_once_takeover.py",
    "local_kafka/test_cluster.py",
}
"""Modules whose tests mostly wait for brokers of their own to stop, freeze or time out: they run
one after the other on one worker (`WAITS_GROUP`) while the other worker computes."""


GROUP_SECONDS: dict[str, int] = {
    "faults/test_faults.py": 840,
    "spark": 430,
    "waits": 395,
    "dagster/test_pool_job.py": 130,
    "bench/test_bench_compare.py": 110,
    "bench/test_bench_growth.py": 105,
    "dagster/test_example_deployment.py": 105,
    "faults/test_standbys.py": 105,
    "dagster/test_sensors.py": 80,
    "core/processing/test_window_worker.py": 130,
    "core/kafka/security/test_least_privilege.py": 50,
    "core/processing/test_background_restores.py": 50,
    "core/recovery/test_at_least_once_promise.py": 50,
    "core/processing/test_group_by_worker.py": 45,
    "core/processing/test_restore_in_loop.py": 45,
    "core/recovery/test_uncommitted_windows.py": 40,
    "local_kafka/test_cli.py": 40,
    "bench/test_bench_standbys.py": 30,
    "core/processing/test_pool.py": 30,
    "core/processing/test_foreign_key_join_worker.py": 40,
    "local_kafka/test_registry.py": 50,
}
"""What each long group of the integration tier took on this 2-core machine (seconds, measured
with `--durations=0`; a group that starts the worker's secured broker counts that too): the groups
start longest first, so that no long group starts last and leaves the other worker idle (one test
of a minute, started last, leaves it idle for up to a minute). A group not listed counts
`SECONDS_PER_TEST` per test."""
SECONDS_PER_TEST = 5


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist would reorder the groups by their number of tests; they come in the order
    # `pytest_collection_modifyitems` gives them (longest first).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook, which tags each item with its group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[pytest.Item, str] = {}
    for item in items:
        directories = set(item.path.relative_to(TESTS).parts[:-1])
        fixtures = set(getattr(item, "fixturenames", ()))
        if INTEGRATION_FIXTURES & fixtures or INTEGRATION_DIRS & directories:
            item.add_marker(pytest.mark.integration)
        groups[item] = _run_group(item, fixtures, directories)
        item.add_marker(pytest.mark.xdist_group(groups[item]))
    _longest_groups_first(items, groups)


def _longest_groups_first(items: list[pytest.Item], groups: dict[pytest.Item, str]) -> None:
    """Sort the items group by group, longest group first, keeping each group's own order."""
    sizes: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        sizes[groups[item]] = sizes.get(groups[item], 0) + 1
        first.setdefault(groups[item], index)
    seconds = {group: GROUP_SECONDS.get(group, SECONDS_PER_TEST * count) for group, count in sizes.items()}
    items.sort(key=lambda item: (-seconds[groups[item]], first[groups[item]]))


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under `--dist loadgroup`, refuse to run when pytest-xdist did not tag the tests with their
    group: the groups would be spread over the workers, silently (fixtures set up twice, Spark
    started on each worker, the waiting modules run side by side)."""
    untagged = [nodeid for nodeid in ids if "@" not in nodeid]
    if node.config.getoption("dist") == "loadgroup" and untagged:
        pytest.exit(
            f"pytest-xdist did not tag {len(untagged)} tests with their xdist_group (first: {untagged[0]}): "
            "its loadgroup does not work with this pytest. Install the versions pyproject.toml pins.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _run_group(item: pytest.Item, fixtures: set[str], directories: set[str]) -> str:
    """The tests that run together, in order, on one pytest-xdist worker (`--dist loadgroup`): the
    waiting modules, every test using Spark, and otherwise each module (whose module-scoped
    fixtures are then set up once)."""
    module = item.path.relative_to(TESTS).as_posix()
    if module in WAITING_MODULES:
        return WAITS_GROUP
    if "spark" in fixtures or "spark" in directories:
        return SPARK_GROUP
    return module


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        yield broker.start(tie_to_parent=True)
    finally:
        gc.collect()  # close clients tests left to the garbage collector while the broker still answers
        broker.stop()


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredEndpoints]:
    """A broker serving SASL_SSL (SCRAM-SHA-512) and mutual TLS only, ACLs denying by default."""
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("secured-kafka-broker"), BrokerSettings(secured=True))
    try:
        broker.start(tie_to_parent=True)
        yield broker.endpoints()
    finally:
        gc.collect()
        broker.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("orders")` -> `orders-<test name>-<random>`, a valid topic and group name."""
    test = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-")[:40]

    def make(prefix: str) -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local Spark session (with the Kafka connector jars) for the whole test run, keeping an
    event log (`spark.eventLog.dir`) that tests can search."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers need this venv's packages
    from pyspark.sql import SparkSession

    from dagster_stateful.spark.connector import spark_jars_conf

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dagster-stateful-tests")
        .config("spark.jars", spark_jars_conf())
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.dir", tmp_path_factory.mktemp("spark-events").as_uri())
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True, scope="session")
def _quiet_noisy_loggers() -> None:
    logging.getLogger("py4j").setLevel(logging.WARNING)
