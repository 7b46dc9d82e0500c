"""Every job of the Dagster layer on a secured cluster (SASL_SSL, SCRAM-SHA-512, a private CA, ACLs
denying by default), as a user holding exactly the ACLs `dagster-stateful acls` lists, with the
password given only as an `EnvVar`: provisioning, the worker job (of an app under each guarantee),
the store's materialization, the Spark snapshot, the restore, clearing state, the Spark restore,
and the lag, rebalance and snapshot sensors; totals exact against the source. With Python logging
and Spark's log4j at DEBUG, the password is in no log line, Dagster event, run config, tag,
materialization metadata, snapshot manifest or Spark event log."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from dagster import DagsterInstance, EnvVar, build_sensor_context, materialize
from dagster._serdes import serialize_value
from faults.counting_worker import COMPACT_FAST
from support.core_helpers import (
    FAST_COMMITS,
    FAST_GROUP,
    add_to_total,
    expected_totals,
    make_orders,
    orders_topic,
    totals_in_store,
)

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App
from dagster_stateful.core.kafka.security.acls import acl_bindings, required_acls
from dagster_stateful.naming import job_name, snapshot_key, store_key
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource

pytestmark = pytest.mark.spark
PARTITIONS = 2
PASSWORD_VARIABLE = "DAGSTER_STATEFUL_TEST_KAFKA_PASSWORD"


@pytest.fixture
def java_debug_log(spark, tmp_path) -> Iterator[Path]:
    """Spark's log4j at DEBUG into a file for the test's duration (its console stays as it was)."""
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    path = tmp_path / "log4j-debug.log"
    appender = (
        log4j.core.appender.FileAppender.newBuilder()
        .withFileName(str(path))
        .setName("secret-search")
        .setLayout(log4j.core.layout.PatternLayout.createDefaultLayout(config))
        .setConfiguration(config)
        .build()
    )
    appender.start()
    root = config.getRootLogger()
    level = root.getLevel()
    root.addAppender(appender, log4j.Level.DEBUG, None)
    root.setLevel(log4j.Level.DEBUG)
    context.updateLoggers()
    try:
        yield path
    finally:
        root.removeAppender("secret-search")
        root.setLevel(level)
        context.updateLoggers()
        appender.stop()


def spark_event_log(spark) -> str:
    """Everything Spark's event log holds so far (the plans and options of every query included)."""
    directory = Path(urlparse(spark.conf.get("spark.eventLog.dir")).path)
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)  # every event of the jobs so far written
    return "".join(path.read_text(errors="replace") for path in sorted(directory.rglob("*")) if path.is_file())


def op_config(app: App, op: str, config: dict) -> dict:
    return {"ops": {job_name(app, op): {"config": config}}}


def test_every_job_runs_as_a_least_privileged_user_and_the_password_appears_nowhere(
    spark, secured_kafka, unique_name, tmp_path, monkeypatch, caplog, java_debug_log
):
    user, password = unique_name("user"), secrets.token_urlsafe(16)
    secured_kafka.admin().add_user(user, password)
    monkeypatch.setenv(PASSWORD_VARIABLE, password)
    orders = make_orders(500, customers=40)
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    app, exactly_once = (
        App(
            name=unique_name(name),
            source=source,
            stores=["totals"],
            processing_guarantee=guarantee,
            changelog_config=COMPACT_FAST,
            consumer_config=FAST_GROUP,
            **FAST_COMMITS,
        )
        for name, guarantee in (("totals", "at-least-once"), ("eos", "exactly-once"))
    )
    for each in (app, exactly_once):
        each.dataframe().apply(add_to_total, stateful=True)
        secured_kafka.admin().grant(acl_bindings(required_acls(each.config, each.topic_specs()), f"User:{user}"))
    kafka = KafkaResource(
        bootstrap_servers=secured_kafka.sasl_ssl,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=user,
        sasl_password=EnvVar(PASSWORD_VARIABLE),
        client_config={"ssl.ca.location": str(secured_kafka.ca_certificate)},
    )
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    resources = {"kafka": kafka, "state_store": state_store, "spark": pyspark}
    defs = build_stateful_definitions([app, exactly_once], PARTITIONS, kafka, state_store, spark=pyspark)
    bound, bound_exactly_once = state_store.bind(app, kafka), state_store.bind(exactly_once, kafka)
    instance = DagsterInstance.ephemeral()
    for logger in ("", "py4j", "dagster_stateful"):
        caplog.set_level(logging.DEBUG, logger=logger)

    def run(purpose: str, run_config: dict | None = None, of: App = app) -> None:
        result = defs.resolve_job_def(job_name(of, purpose)).execute_in_process(
            instance=instance, run_config=run_config or {}
        )
        assert result.success, purpose

    run("provision")
    run("worker", op_config(app, "run_worker_op", {"max_seconds": 120}))
    assert totals_in_store(bound, PARTITIONS) == expected_totals(orders)
    run("provision", of=exactly_once)
    run("worker", op_config(exactly_once, "run_worker_op", {"max_seconds": 120}), of=exactly_once)
    assert totals_in_store(bound_exactly_once, PARTITIONS) == expected_totals(orders)
    store_asset = defs.get_assets_def(store_key(app, "totals"))
    snapshot_asset = defs.get_assets_def(snapshot_key(app, "totals"))
    assert materialize([store_asset], resources=resources, instance=instance, partition_key="0").success
    assert materialize([snapshot_asset], resources=resources, instance=instance).success
    run("clear_state", op_config(app, "clear_state_op", {"partitions": [0, 1], "confirm": True}))
    run("restore", op_config(app, "restore_op", {"partitions": [0, 1]}))
    assert totals_in_store(bound, PARTITIONS) == expected_totals(orders)
    spark_restore = {"partitions": [0, 1], "from_scratch": True, "method": "spark"}
    run("spark_restore", op_config(app, "spark_restore_op", spark_restore))
    assert totals_in_store(bound, PARTITIONS) == expected_totals(orders)
    for sensor in ("lag_sensor", "rebalance_sensor", "snapshot_sensor"):
        with build_sensor_context(instance=instance, resources=resources) as context:
            defs.resolve_sensor_def(job_name(app, sensor))(context)

    runs = instance.get_runs()
    assert len(runs) >= 9
    places = {
        "Python's DEBUG log": caplog.text,
        "Spark's DEBUG log": java_debug_log.read_text(errors="replace"),
        "the runs' configs and tags": repr([(r.run_config, r.tags) for r in runs]),
        "the Dagster events (metadata included)": serialize_value(
            [record for r in runs for record in instance.all_logs(r.run_id)]
        ),
        "the snapshot manifests": "".join(p.read_text() for p in (tmp_path / "snapshots").rglob("*.json")),
        "Spark's event log": spark_event_log(spark),
    }
    assert "kafka" in places["Spark's DEBUG log"].lower(), "log4j logged Kafka's client at DEBUG"
    assert app.changelog_topic("totals") in places["Spark's event log"], "the event log holds the snapshot's plan"
    assert f'username="{user}"' in places["Python's DEBUG log"], "py4j logged the options (the JAAS line's user)"
    for place, text in places.items():
        assert password not in text, f"the password is in {place}"
