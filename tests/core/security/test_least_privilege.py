"""An app on a secured cluster (SASL_SSL with SCRAM-SHA-512, TLS with a private CA, ACLs denying by
default) run as a user holding exactly the ACLs `required_acls` lists, and nothing more:
provisioning, a worker under each guarantee (with a poison message dead-lettered), and a full
restore after its local state is deleted, against totals recomputed from the source topic, with
changelogs compacted as fast as Kafka allows. And the same over mutual TLS."""

from __future__ import annotations

import secrets

import pytest
from core_helpers import (
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
from fault_worker import COMPACT_FAST
from kafka_helpers import produce, read_all

from dagster_stateful.core import App
from dagster_stateful.core.kafka.acls import acl_bindings, required_acls
from dagster_stateful.core.monitoring.report import RestoreKind
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
