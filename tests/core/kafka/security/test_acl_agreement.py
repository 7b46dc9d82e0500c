"""The least-privilege table and the authorization errors share one ACL model: what each part of a
worker needs (`consuming`, `producing`, `transacting`, named by the errors) is in `required_acls` of
the same app, so the table a user grants and the errors they read can never disagree. No broker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from dagster_stateful.core import App
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.acls import required_acls, transactional_id_prefix
from dagster_stateful.core.kafka.security.authorization import (
    authorization_error,
    consuming,
    producing,
    transacting,
)


def app(tmp_path, **settings) -> App:
    built = App(name="orders-app", source="orders", stores=["totals", "counts"], state_dir=tmp_path, **settings)
    steps = built.dataframe().apply(lambda order, state: order, stateful=True, store="totals")
    if built.config.output:
        built.to_topic(steps)
    return built


def worker_needs(built: App) -> set[AclRequirement]:
    config = built.config
    needs = {*consuming(config), *producing(config)}
    if config.exactly_once:
        needs |= set(transacting(config, transactional_id_prefix(config)))
    return needs


@pytest.mark.parametrize(
    "settings",
    [
        {"processing_guarantee": "exactly-once", "output": "orders-out", "on_error": "dead-letter"},
        {"processing_guarantee": "exactly-once", "auto_create_topics": False},
        {"output": "orders-out", "on_error": "dead-letter"},
        {"use_changelog_topics": False},
    ],
)
def test_what_a_workers_parts_need_is_in_the_apps_least_privilege_table(tmp_path, settings):
    built = app(tmp_path, **settings)

    needs = worker_needs(built)
    missing = needs - set(required_acls(built.config, built.topic_specs()))

    assert not missing, f"needed by a worker, not in the table: {sorted(map(str, missing))}"


def test_an_exactly_once_workers_needs_name_its_transactional_ids_and_every_topic_it_writes(tmp_path):
    built = app(tmp_path, processing_guarantee="exactly-once", output="orders-out", on_error="dead-letter")

    needs = {str(acl) for acl in worker_needs(built)}

    assert needs == {
        "Read on topic orders",
        "Read on group orders-app",
        "Write on topic orders-app-totals-changelog",
        "Write on topic orders-app-counts-changelog",
        "Write on topic orders-out",
        "Write on topic orders-app-dead-letter",
        "Write on transactional-id names starting with 'orders-app-eos-'",
    }


def test_idempotent_write_is_in_neither_the_table_nor_the_needs_but_a_refusal_naming_it_is_explained(tmp_path):
    built = app(tmp_path, processing_guarantee="exactly-once", output="orders-out")
    listed = [*required_acls(built.config, built.topic_specs()), *worker_needs(built)]
    assert not any(acl.operation is Operation.IDEMPOTENT_WRITE for acl in listed), "KIP-679: Write on a topic"

    refusal = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Failed to acquire idempotence PID from broker")
    error = authorization_error(refusal, "producing to topic orders-out", producing(built.config))

    assert (error.operation, error.resource_type, error.resource_name) == (
        "IdempotentWrite",
        "cluster",
        "kafka-cluster",
    )
    assert "not authorized: IdempotentWrite on cluster kafka-cluster (brokers of Kafka 3.0" in str(error)


def test_a_refusal_names_the_needed_acl_of_the_refused_resource_type(tmp_path):
    config = app(tmp_path).config
    refusal = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed")

    error = authorization_error(refusal, "consuming orders", consuming(config), principal="User:orders")

    assert (error.operation, error.resource_type, error.resource_name) == ("Read", "group", "orders-app")
    assert type(error.operation) is str and type(error.resource_type) is str, "plain strings, as before"
    assert str(error).startswith("not authorized: Read on group orders-app, while consuming orders (Kafka: ")
    assert "--principal User:orders" in str(error)
    assert AclRequirement(ResourceType.GROUP, "orders-app", Operation.READ, why="another reason") in consuming(config)
