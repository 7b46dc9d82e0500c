"""Provisioning: the plan names every topic, missing changelogs are created right, wrong ones are refused."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from support.core_helpers import add_to_total, expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import create_topic, wait_for

from dagster_stateful.core import App, State
from dagster_stateful.core.kafka.provisioning import TopicRole, TopicStatus
from dagster_stateful.errors import TopicMismatchError, TopicMissingError

COORDINATOR_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


def committed_offsets(app: App, partitions: list[int]) -> dict[int, int | None]:
    """The group's committed offsets, read by a consumer of the group that never joins it.

    Not `app.kafka.committed_offsets`: for a group no member ever joined, the broker may answer the admin
    ListConsumerGroupOffsets with COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR, and librdkafka (2.16.1)
    then crashes the process in rd_kafka_cgrp_op (confluentinc/librdkafka#5040). A consumer gets those
    errors as exceptions, so they are retried here until the coordinator is ready.
    """
    consumer = Consumer(
        {"bootstrap.servers": app.kafka.bootstrap_servers, "group.id": app.consumer_group, "enable.auto.commit": False}
    )

    def attempt() -> list[TopicPartition] | None:
        try:
            return consumer.committed([TopicPartition(app.source, p) for p in partitions], timeout=10)
        except KafkaException as error:
            if error.args[0].code() in COORDINATOR_NOT_READY:
                return None
            raise

    try:
        found = wait_for(attempt, 60, f"the coordinator of group {app.consumer_group}")
    finally:
        consumer.close()
    return {tp.partition: (None if tp.offset < 0 else tp.offset) for tp in found}


def count_order(_order: dict, state: State) -> None:
    state.set("orders", state.get("orders", 0) + 1)


def test_plan_lists_every_topic_with_its_config_and_changes_nothing(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, make_orders(5, customers=2))
    output = unique_name("out")
    app = App(
        name=unique_name("totals"),
        source=source,
        stores=["totals", "counts"],
        output=output,
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        on_error="dead-letter",
        changelog_config={"segment.ms": "3600000"},
    )
    sdf = app.dataframe().update(count_order, store="counts").apply(add_to_total, store="totals")
    app.to_topic(sdf)

    plan = app.provisioning_plan()

    roles = {check.spec.name: check.spec.role for check in plan.checks}
    assert roles == {
        source: TopicRole.SOURCE,
        f"{app.name}-totals-changelog": TopicRole.CHANGELOG,
        f"{app.name}-counts-changelog": TopicRole.CHANGELOG,
        output: TopicRole.OUTPUT,
        f"{app.name}-dead-letter": TopicRole.DEAD_LETTER,
    }
    assert plan.check(source).status is TopicStatus.OK and plan.check(source).found_partitions == 3
    for name in roles.keys() - {source}:
        check = plan.check(name)
        assert check.status is TopicStatus.MISSING and check.spec.partitions == 3, name
    for store in ("totals", "counts"):
        assert plan.check(app.changelog_topic(store)).spec.config == {
            "cleanup.policy": "compact",
            "segment.ms": "3600000",
        }
    assert plan.problems == []

    table = plan.describe()
    for name, role in roles.items():
        line = next(line for line in table.splitlines() if f" {name} " in line)
        assert line.startswith(role.value) and " 3 " in line, line
    assert table.count("cleanup.policy=compact,segment.ms=3600000") == 2
    assert "missing" in table

    for name in roles.keys() - {source}:
        assert app.kafka.partition_count(name) is None, f"inspecting created {name}"


def test_provision_creates_missing_changelog_compacted_like_the_source(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, [])
    app = totals_app(
        kafka_bootstrap, source, tmp_path, unique_name("totals"), changelog_config={"segment.ms": "3600000"}
    )
    changelog = app.changelog_topic("totals")
    assert changelog == f"{app.name}-totals-changelog"

    plan = app.provision()

    assert plan.check(changelog).status is TopicStatus.CREATED
    assert app.kafka.partition_count(changelog) == 3
    config = app.kafka.topic_config(changelog)
    assert config["cleanup.policy"] == "compact" and config["segment.ms"] == "3600000"
    again = app.provision()
    assert again.check(changelog).status is TopicStatus.OK, "a second provision finds everything in place"


def test_changelog_with_wrong_partition_count_is_refused_and_left_alone(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, [])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    changelog = app.changelog_topic("totals")
    create_topic(kafka_bootstrap, changelog, partitions=2, config={"cleanup.policy": "compact"})

    assert app.provisioning_plan().check(changelog).status is TopicStatus.MISMATCH
    with pytest.raises(TopicMismatchError) as raised:
        app.provision()

    message = str(raised.value)
    assert changelog in message
    assert "has 2 partitions" in message and "source topic has 3" in message, message
    assert app.kafka.partition_count(changelog) == 2, "the existing topic must not be changed"


def test_changelog_with_delete_policy_is_refused_and_left_alone(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, [])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    changelog = app.changelog_topic("totals")
    create_topic(kafka_bootstrap, changelog, partitions=2, config={"cleanup.policy": "delete"})

    with pytest.raises(TopicMismatchError) as raised:
        app.provision()

    message = str(raised.value)
    assert changelog in message and "cleanup.policy=delete" in message and "compact" in message, message
    assert app.kafka.topic_config(changelog)["cleanup.policy"] == "delete"
    assert app.kafka.partition_count(changelog) == 2


def test_missing_source_topic_is_an_error_and_nothing_is_created(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("no-such-orders")
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))

    plan = app.provisioning_plan()
    assert plan.check(source).status is TopicStatus.MISSING and plan.problems
    with pytest.raises(TopicMissingError) as raised:
        app.provision()

    assert source in str(raised.value)
    assert app.kafka.partition_count(app.changelog_topic("totals")) is None


def test_worker_refuses_to_start_on_mismatched_changelog(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, make_orders(30, customers=3))
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    changelog = app.changelog_topic("totals")
    create_topic(kafka_bootstrap, changelog, partitions=1, config={"cleanup.policy": "compact"})

    with pytest.raises(TopicMismatchError) as raised:
        app.run_worker(max_seconds=60)

    assert changelog in str(raised.value)
    assert committed_offsets(app, [0, 1, 2]) == {0: None, 1: None, 2: None}, "nothing was processed"
    assert not (tmp_path / app.name / "totals").exists(), "no store partition was opened"
    assert app.kafka.partition_count(changelog) == 1


def test_without_changelog_topics_warns_and_creates_none(kafka_bootstrap, unique_name, tmp_path, caplog):
    orders = make_orders(40, customers=4)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    name = unique_name("totals")

    with caplog.at_level(logging.WARNING, logger="dagster_stateful"):
        app = totals_app(kafka_bootstrap, source, tmp_path, name, use_changelog_topics=False)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and name in r.getMessage()]
    assert len(warnings) == 1 and "changelog" in warnings[0].getMessage(), caplog.text
    assert [check.spec.role for check in app.provisioning_plan().checks] == [TopicRole.SOURCE]

    report = app.run_worker(max_seconds=60)

    assert report.stop_reason == "caught_up" and report.total_processed == len(orders)
    assert totals_in_store(app, 2) == expected_totals(orders)
    assert app.kafka.partition_count(app.changelog_topic("totals")) is None, "no changelog topic was created"
