"""Spark's snapshot of a changelog on a secured cluster, as a user holding exactly the app's ACLs:
over SASL_SSL (SCRAM-SHA-512, a private CA) and over mutual TLS, the librdkafka settings the
engine uses translated for Spark's Java client, the snapshot holding every total recomputed from
the source; and the password in no option, no py4j command (logged at DEBUG) and no manifest."""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict

import orjson
import pytest
from faults.counting_worker import COMPACT_FAST
from support.core_helpers import FAST_COMMITS, FAST_GROUP, add_to_total, expected_totals, make_orders, orders_topic

from dagster_stateful.core import App
from dagster_stateful.core.kafka.security.acls import acl_bindings, required_acls
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.state.keys import split_store_key
from dagster_stateful.local_kafka.secured import SecuredEndpoints
from dagster_stateful.spark.kafka_options import SecretsFile, spark_kafka_options
from dagster_stateful.spark.snapshots import snapshot_changelog

PARTITIONS = 2


def app_as(secured_kafka: SecuredEndpoints, settings: dict, principal: str, name: str, source: str, tmp_path) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=tmp_path / "state",
        kafka=settings,
        changelog_config=COMPACT_FAST,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    app.dataframe().apply(add_to_total, stateful=True)
    secured_kafka.admin().grant(acl_bindings(required_acls(app.config, app.topic_specs()), principal))
    return app


def snapshot_totals(snapshots: SnapshotStore, snapshot_id: str) -> dict[str, int]:
    totals = {}
    for partition in range(PARTITIONS):
        for keys, values in snapshots.read_partition(snapshot_id, partition):
            for key, value in zip(keys, values, strict=True):
                totals[split_store_key(key)[0].decode()] = orjson.loads(value)
    return totals


@pytest.mark.parametrize("listener", ["sasl_ssl", "mutual_tls"])
def test_spark_snapshots_a_secured_changelog_without_the_password_anywhere(
    spark, secured_kafka, unique_name, tmp_path, caplog, listener
):
    password = secrets.token_urlsafe(16)
    if listener == "sasl_ssl":
        user = unique_name("user")
        secured_kafka.admin().add_user(user, password)
        settings = secured_kafka.sasl_settings(user, password)
    else:
        user = unique_name("client")
        settings = secured_kafka.mutual_tls_settings(user)
    orders = make_orders(400, customers=25)
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    app = app_as(secured_kafka, settings, f"User:{user}", unique_name("totals"), source, tmp_path)
    app.provision()
    assert app.run_worker(max_seconds=120).total_processed == len(orders)
    options = spark_kafka_options(settings, SecretsFile())
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), app.name, "totals")

    caplog.set_level(logging.DEBUG, logger="py4j")
    taken = snapshot_changelog(
        spark, app.kafka, options, app.consumer_group, app.source, app.changelog_topic("totals"), snapshots
    )

    assert snapshot_totals(snapshots, taken.manifest.snapshot_id) == expected_totals(orders)
    assert "py4j" in caplog.text, "py4j's commands were logged, so the search below means something"
    for place, text in {
        "the options": json.dumps(options),
        "py4j's DEBUG log": caplog.text,
        "the manifest": json.dumps(asdict(taken.manifest), default=str),
    }.items():
        assert password not in text, f"the password is in {place}"
