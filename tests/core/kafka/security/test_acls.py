"""The ACLs an app needs, derived from its configuration: what each guarantee and each topic adds,
and the `dagster-stateful acls` command that prints them for `kafka-acls` or as a table. (That
they are enough, and work, is proven against a secured broker in test_least_privilege.py.)"""

from __future__ import annotations

import shlex

from dagster_stateful.cli import main
from dagster_stateful.core import App
from dagster_stateful.core.kafka.security.acl_model import Operation, PatternType, ResourceType
from dagster_stateful.core.kafka.security.acls import required_acls


def app(tmp_path, **settings) -> App:
    built = App(name="orders-app", source="orders", stores=["totals", "counts"], state_dir=tmp_path, **settings)
    built.dataframe().apply(lambda order, state: order, stateful=True, store="totals")
    return built


def granted(built: App) -> set[tuple[ResourceType, str, PatternType, Operation]]:
    return {(a.resource_type, a.name, a.pattern, a.operation) for a in required_acls(built.config, built.topic_specs())}


def test_an_at_least_once_app_reads_its_source_writes_its_changelogs_and_uses_its_group(tmp_path):
    acls = granted(app(tmp_path))

    topic, group, literal = ResourceType.TOPIC, ResourceType.GROUP, PatternType.LITERAL
    assert (topic, "orders", literal, Operation.READ) in acls
    assert not any(name == "orders" and op in {Operation.WRITE, Operation.CREATE} for _, name, _, op in acls)
    for changelog in ("orders-app-totals-changelog", "orders-app-counts-changelog"):
        for operation in (Operation.CREATE, Operation.WRITE, Operation.READ, Operation.DESCRIBE_CONFIGS):
            assert (topic, changelog, literal, operation) in acls
    assert (group, "orders-app", literal, Operation.READ) in acls
    assert not any(op is Operation.DESCRIBE and name in {"orders", "orders-app"} for _, name, _, op in acls), (
        "Read implies Describe"
    )
    assert not any(resource is ResourceType.TRANSACTIONAL_ID for resource, *_ in acls), "no transactions"


def test_exactly_once_adds_the_workers_transactional_ids_as_a_prefix(tmp_path):
    acls = granted(app(tmp_path, processing_guarantee="exactly-once"))

    prefix = (ResourceType.TRANSACTIONAL_ID, "orders-app-eos-", PatternType.PREFIXED)
    assert (*prefix, Operation.WRITE) in acls


def test_output_and_dead_letter_topics_are_written_and_created_only_when_the_app_creates_topics(tmp_path):
    built = app(tmp_path, output="orders-out", on_error="dead-letter", auto_create_topics=False)
    built.to_topic(built.dataframe())
    acls = granted(built)

    for name in ("orders-out", "orders-app-dead-letter"):
        assert (ResourceType.TOPIC, name, PatternType.LITERAL, Operation.WRITE) in acls
    assert not any(op is Operation.CREATE for *_, op in acls), "topics made by hand need no Create"


def test_the_acls_command_prints_kafka_acls_commands_and_a_table(capsys):
    assert (
        main(["acls", "example.apps:order_totals", "--principal", "User:totals", "--bootstrap-server", "k:9093"]) == 0
    )
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert all(words[0] == "kafka-acls.sh" and "--add" in words for words in commands)
    source = next(words for words in commands if words[-2:] == ["--topic", "orders"])
    assert source[source.index("--allow-principal") + 1] == "User:totals"
    assert [source[i + 1] for i, word in enumerate(source) if word == "--operation"] == ["Read"]

    assert main(["acls", "example.apps:order_totals", "--table"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| resource | pattern | operation | why |")
    assert "| group `order-totals` | literal | Read |" in table
