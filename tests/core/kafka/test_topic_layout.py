"""Topic layouts the app accepts: any partition count for output and dead-letter topics (only changelogs
must match the source), and the brokers' default replication factor unless the app asks for another."""

from __future__ import annotations

import orjson
from confluent_kafka.admin import AdminClient, ConfigResource
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app
from support.kafka_helpers import create_topic, produce, read_all

from dagster_stateful.core import App
from dagster_stateful.core.kafka.descriptions import TopicLayout
from dagster_stateful.core.kafka.provisioning import TopicStatus

NOT_JSON = b"{not json"


def running_totals(orders: list[tuple[bytes, bytes]]) -> dict[bytes, list[int]]:
    """Per customer, the totals the app emits, in order."""
    totals: dict[bytes, list[int]] = {}
    for key, value in orders:
        previous = totals.setdefault(key, [])
        previous.append((previous[-1] if previous else 0) + orjson.loads(value)["amount"])
    return totals


def plan_line(table: str, topic: str) -> str:
    return next(line for line in table.splitlines() if f" {topic} " in line)


def broker_default_replication(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(admin.list_topics(timeout=10).brokers))))
    return int(admin.describe_configs([broker])[broker].result(timeout=30)["default.replication.factor"].value)


def test_output_and_dead_letter_topics_may_have_more_partitions_than_the_source(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(60, customers=6)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    produce(kafka_bootstrap, source, [(b"c0", NOT_JSON)])
    output = unique_name("out")
    create_topic(kafka_bootstrap, output, partitions=12)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="dead-letter")
    app.to_topic(app.dataframe(), output)
    create_topic(kafka_bootstrap, app.dead_letter_topic, partitions=5)

    plan = app.provisioning_plan()

    assert plan.problems == [], plan.describe()
    assert plan.check(output).status is TopicStatus.OK and plan.check(output).found_partitions == 12
    assert plan.check(app.dead_letter_topic).status is TopicStatus.OK
    table = plan.describe()
    assert " 12 " in plan_line(table, output) and " 5 " in plan_line(table, app.dead_letter_topic), table

    report = app.run_worker(max_seconds=90)

    assert report.stop_reason == "caught_up", report
    assert report.total_processed == len(orders) + 1 and report.dead_lettered == 1, report
    emitted: dict[bytes, list[int]] = {}
    for key, value in read_all(kafka_bootstrap, output):
        assert key is not None and value is not None
        emitted.setdefault(key, []).append(orjson.loads(value)["total"])
    assert emitted == running_totals(orders), "every result, in order per customer, is on the 12-partition topic"
    assert {key.decode(): totals[-1] for key, totals in emitted.items()} == expected_totals(orders)
    assert read_all(kafka_bootstrap, app.dead_letter_topic) == [(b"c0", NOT_JSON)]
    assert app.kafka.partition_count(output) == 12 and app.kafka.partition_count(app.dead_letter_topic) == 5


def test_only_the_changelog_must_match_the_source_partitions(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, [])
    output = unique_name("out")
    create_topic(kafka_bootstrap, output, partitions=12)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    app.to_topic(app.dataframe(), output)
    changelog = app.changelog_topic("totals")
    create_topic(kafka_bootstrap, changelog, partitions=12, config={"cleanup.policy": "compact"})

    plan = app.provisioning_plan()

    assert plan.check(output).status is TopicStatus.OK and not plan.check(output).problems
    assert plan.check(changelog).status is TopicStatus.MISMATCH
    assert len(plan.problems) == 1 and changelog in plan.problems[0], plan.problems
    assert "has 12 partitions" in plan.problems[0] and "source topic has 2" in plan.problems[0]


def test_missing_output_and_dead_letter_topics_are_created_like_the_source(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 3, [])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), on_error="dead-letter")
    output = unique_name("out")
    app.to_topic(app.dataframe(), output)

    plan = app.provision()

    for topic in (output, app.dead_letter_topic, app.changelog_topic("totals")):
        assert plan.check(topic).status is TopicStatus.CREATED, topic
        assert app.kafka.partition_count(topic) == 3, topic


def test_topics_get_the_brokers_default_replication_factor(kafka_bootstrap, unique_name, tmp_path):
    default = broker_default_replication(kafka_bootstrap)  # 1 on the local broker
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, [])
    output = unique_name("out")
    app = App(
        name=unique_name("totals"),
        source=source,
        stores=["totals"],
        output=output,
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        on_error="dead-letter",
    )
    app.to_topic(app.dataframe(), output)
    assert app.config.changelog_replication_factor == -1, "the default is the brokers' default, as in Kafka Streams"
    managed = [app.changelog_topic("totals"), output, app.dead_letter_topic]

    before = app.provisioning_plan().describe()
    for topic in managed:
        assert " default " in plan_line(before, topic) and "missing" in plan_line(before, topic), before

    plan = app.provision()

    for topic in managed:
        assert app.kafka.topic_layout(topic) == TopicLayout(partitions=2, replication_factor=default), topic
        assert plan.check(topic).found_replication == default
    for table in (plan.describe(), app.provisioning_plan().describe()):
        for topic in managed:
            assert f" default ({default}) " in plan_line(table, topic), table
        assert f" {default} " in plan_line(table, source), table
    assert [check.warnings for check in plan.checks] == [[], [], [], []], "the default replication is no warning"

    direct = unique_name("direct")
    app.kafka.create_topic(direct, 3, -1, {})
    assert app.kafka.topic_layout(direct) == TopicLayout(partitions=3, replication_factor=default)


def test_an_explicit_replication_factor_the_topic_lacks_is_a_warning(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, [])
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"), changelog_replication_factor=3)
    changelog = app.changelog_topic("totals")
    create_topic(kafka_bootstrap, changelog, partitions=2, config={"cleanup.policy": "compact"})

    plan = app.provisioning_plan()

    check = plan.check(changelog)
    assert check.status is TopicStatus.OK and check.found_replication == 1
    assert check.warnings == [
        "replication factor is 1, the app asks for 3 (left unchanged; raise it with `kafka-reassign-partitions`, "
        "or set changelog_replication_factor to match)"
    ]
    assert " 3 (has 1) " in plan_line(plan.describe(), changelog)
