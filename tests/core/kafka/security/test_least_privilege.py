"""An app on a secured cluster (SASL_SSL with SCRAM-SHA-512, TLS with a private CA, ACLs denying by
default) run as a user holding exactly the ACLs `required_acls` lists, and nothing more:
provisioning, a worker under each guarantee (with a poison message dead-lettered), and a full
restore after its local state is deleted, against totals recomputed from the source topic, with
changelogs compacted as fast as Kafka allows. And the same over mutual TLS, and for an app joining a
partitioned table and re-keying through its repartition topic. And each of those ACLs
is needed: without any one of them, one of the app's jobs is refused, naming it."""

from __future__ import annotations

import secrets

import orjson
import pytest
from faults.counting_worker import COMPACT_FAST
from support.core_helpers import (
    FAST_COMMITS,
    FAST_GROUP,
    NOT_JSON,
    add_to_total,
    expected_totals,
    make_orders,
    orders_topic,
    outputs_per_customer,
    running_sums,
    totals_in_store,
)
from support.kafka_helpers import create_topic, produce, read_all

from dagster_stateful.core import App, Sum
from dagster_stateful.core.kafka.security.acl_model import Operation
from dagster_stateful.core.kafka.security.acls import acl_bindings, required_acls, transactional_id_prefix
from dagster_stateful.core.monitoring.report import RestoreKind
from dagster_stateful.errors import KafkaAuthorizationError
from dagster_stateful.local_kafka.secured import SecuredEndpoints

PARTITIONS = 3
ORDERS = 600


def secured_app(settings: dict, name: str, source: str, tmp_path, guarantee: str) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        output=f"{name}-out",
        on_error="dead-letter",
        state_dir=tmp_path,
        kafka=settings,
        processing_guarantee=guarantee,
        changelog_config=COMPACT_FAST,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    app.to_topic(app.dataframe().apply(add_to_total, stateful=True))
    return app


def grant_exactly(secured_kafka: SecuredEndpoints, app: App, principal: str) -> None:
    secured_kafka.admin().grant(acl_bindings(required_acls(app.config, app.topic_specs()), principal))


def run_and_check(app: App, secured_kafka: SecuredEndpoints, source: str, orders: list) -> None:
    """Provision, process everything, delete the local state, restore it: totals exact each time."""
    plan = app.provision()
    assert not plan.problems, plan.describe()
    report = app.run_worker(max_seconds=120)
    assert report.stop_reason == "caught_up" and report.total_processed == len(orders) + 1
    assert report.dead_lettered == 1, "the poison message went to the dead-letter topic"
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)

    app.clear_state()
    restored = app.run_worker(max_seconds=120)
    assert {r.kind for r in restored.restores} == {RestoreKind.FULL} and len(restored.restores) == PARTITIONS
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)
    assert outputs_per_customer(secured_kafka.internal, app.config.output or "") == running_sums(
        secured_kafka.internal, source
    )
    assert [value for _, value in read_all(secured_kafka.internal, app.config.dead_letter_topic)] == [NOT_JSON]


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_an_app_runs_and_restores_over_sasl_ssl_as_a_user_holding_exactly_its_acls(
    secured_kafka, unique_name, tmp_path, guarantee
):
    user, password = unique_name("user"), secrets.token_urlsafe(16)
    secured_kafka.admin().add_user(user, password)
    orders = make_orders(ORDERS, customers=30)
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    produce(secured_kafka.internal, source, [(b"c0", NOT_JSON)])
    app = secured_app(secured_kafka.sasl_settings(user, password), unique_name("totals"), source, tmp_path, guarantee)
    grant_exactly(secured_kafka, app, f"User:{user}")

    run_and_check(app, secured_kafka, source, orders)


def test_an_app_runs_over_mutual_tls_as_the_principal_its_certificate_names(secured_kafka, unique_name, tmp_path):
    client = unique_name("client")
    orders = make_orders(ORDERS, customers=30)
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    produce(secured_kafka.internal, source, [(b"c0", NOT_JSON)])
    settings = secured_kafka.mutual_tls_settings(client)
    app = secured_app(settings, unique_name("totals"), source, tmp_path, "exactly-once")
    grant_exactly(secured_kafka, app, f"User:{client}")

    run_and_check(app, secured_kafka, source, orders)


NEEDED_BY_ROLE = [
    ("source", Operation.READ),
    ("changelog", Operation.CREATE),
    ("changelog", Operation.DESCRIBE_CONFIGS),
    ("changelog", Operation.WRITE),
    ("changelog", Operation.READ),
    ("output", Operation.CREATE),
    ("output", Operation.WRITE),
    ("dead-letter", Operation.CREATE),
    ("dead-letter", Operation.WRITE),
    ("group", Operation.READ),
    ("restore group", Operation.DESCRIBE),
    ("verify group", Operation.DESCRIBE),
    ("transactional ids", Operation.WRITE),
]
"""Every ACL `required_acls` lists for an exactly-once app with an output and a dead-letter topic,
by what it is for (the names differ per test)."""


def role_names(app: App) -> dict[str, str]:
    config = app.config
    return {
        "source": config.source,
        "changelog": app.changelog_topic("totals"),
        "output": config.output or "",
        "dead-letter": config.dead_letter_topic,
        "group": config.consumer_group,
        "restore group": config.restore_group,
        "verify group": config.verify_group,
        "transactional ids": transactional_id_prefix(config),
    }


def every_job(app: App) -> None:
    """Provision, process (a poison message included), delete the local state and restore it through a
    worker, then verify a partition against a changelog replay: every use the app makes of Kafka."""
    app.provision()
    app.run_worker(max_seconds=60)
    app.clear_state()
    app.run_worker(max_seconds=60)
    app.replay_digest("totals", 0)


def test_the_table_lists_every_acl_an_app_needs_and_each_one_is_needed(secured_kafka, unique_name, tmp_path):
    orders = make_orders(60, customers=10)
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    produce(secured_kafka.internal, source, [(b"c0", NOT_JSON)])
    listed = secured_app(
        secured_kafka.sasl_settings("nobody", "-"), unique_name("listed"), source, tmp_path, "exactly-once"
    )
    names = role_names(listed)
    assert {(a.name, a.operation) for a in required_acls(listed.config, listed.topic_specs())} == {
        (names[role], operation) for role, operation in NEEDED_BY_ROLE
    }, "the table and this test name the same ACLs"

    for role, operation in NEEDED_BY_ROLE:
        user, password = unique_name("user"), secrets.token_urlsafe(16)
        secured_kafka.admin().add_user(user, password)
        settings = secured_kafka.sasl_settings(user, password)
        app = secured_app(settings, unique_name("totals"), source, tmp_path / user, "exactly-once")
        name = role_names(app)[role]
        granted = [
            a for a in required_acls(app.config, app.topic_specs()) if (a.name, a.operation) != (name, operation)
        ]
        secured_kafka.admin().grant(acl_bindings(granted, f"User:{user}"))

        with pytest.raises(KafkaAuthorizationError) as refused:
            every_job(app)

        described = str(refused.value)
        assert name in described and f"{refused.value.resource_type} " in described, (role, operation, described)


def test_a_re_keying_app_joining_a_table_runs_as_a_user_holding_exactly_its_acls(secured_kafka, unique_name, tmp_path):
    """Orders keyed by order re-keyed by customer through the repartition topic (purged as it goes),
    joined (inner) with a partitioned table of the customers it holds, and summed, exactly once: the
    table's topic, the repartition topic and the rest, each with only the operations the ACL table
    lists."""
    user, password = unique_name("user"), secrets.token_urlsafe(16)
    secured_kafka.admin().add_user(user, password)
    tiers = {f"c{c}": f"t{c % 4}" for c in range(0, 30, 2)}  # the odd customers have no profile
    customers = unique_name("customers")
    create_topic(secured_kafka.internal, customers, PARTITIONS, {**COMPACT_FAST, "cleanup.policy": "compact"})
    profile_records = [(c.encode(), orjson.dumps({"tier": t})) for c, t in tiers.items()]
    # Placed as the repartition topic places them.
    produce(secured_kafka.internal, customers, profile_records, partitioner="murmur2_random")
    orders = [(f"o{i}".encode(), value) for i, (_, value) in enumerate(make_orders(ORDERS, customers=30))]
    source = orders_topic(secured_kafka.internal, unique_name("orders"), PARTITIONS, orders)
    app = App(
        name=unique_name("profiled"),
        source=source,
        stores=["totals"],
        state_dir=tmp_path,
        kafka=secured_kafka.sasl_settings(user, password),
        processing_guarantee="exactly-once",
        changelog_config=COMPACT_FAST,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    profiles = app.table(customers, name="profiles")
    app.dataframe().group_by("customer").join(profiles, on_merge="keep-left").aggregate(Sum("amount"), name="total")
    grant_exactly(secured_kafka, app, f"User:{user}")

    report = app.run_worker(max_seconds=120)

    expected: dict[str, int] = {}
    for _, value in orders:
        order = orjson.loads(value)
        if order["customer"] in tiers:
            expected[order["customer"]] = expected.get(order["customer"], 0) + order["amount"]
    assert report.stop_reason == "caught_up"
    with app.read_state("totals") as reader:
        assert {entry.message_key: entry.value for entry in reader.items()} == expected
