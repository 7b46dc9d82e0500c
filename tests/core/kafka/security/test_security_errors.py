"""A secured cluster's refusals reach the operator within seconds, as what they are: authentication
(which user, which mechanism), TLS (an untrusted certificate, a host name mismatch) or
authorization (which operation on which resource), each saying what to change, never holding a
password, and never waited out as an outage (a bounded worker stays within its bound).

Runs against the session's secured broker (SASL_SSL with SCRAM-SHA-512 only, ACLs denying by
default); each test has its own user, topics and app.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from support.core_helpers import FAST_COMMITS, FAST_GROUP, add_to_total, make_orders, orders_topic
from support.kafka_helpers import wait_for

from dagster_stateful.core import App
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.security.acl_model import Operation
from dagster_stateful.core.kafka.security.acl_model import ResourceType as AclResource
from dagster_stateful.core.kafka.security.acls import acl_bindings, required_acls
from dagster_stateful.errors import (
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    KafkaSecurityError,
    KafkaTlsError,
)
from dagster_stateful.local_kafka.secured import SecuredEndpoints
from dagster_stateful.local_kafka.tls import untrusted_ca_certificate

WITHIN_SECONDS = 10.0
"""How soon each refusal must be raised (librdkafka reports one within about a second)."""
MAX_SECONDS = 20.0
"""The bounded workers' `max_seconds`: a refusal must end them well before it."""
PASSWORD = "correct-horse-battery-staple-7f3a"
WRONG_PASSWORD = "wrong-horse-battery-staple-91c2"


def make_app(settings: dict[str, Any], source: str, state_dir: Path, name: str, **options: Any) -> App:
    app = App(
        name=name,
        source=source,
        stores=["totals"],
        state_dir=state_dir,
        kafka=settings,
        consumer_config={**FAST_GROUP, **options.pop("consumer_config", {})},
        **{**FAST_COMMITS, **options},
    )
    app.dataframe().apply(add_to_total, stateful=True)
    return app


def run_refused(app: App) -> tuple[KafkaSecurityError, float]:
    """The error a bounded worker of `app` raises, and how many seconds it took."""
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError) as raised:
        app.run_worker(max_seconds=MAX_SECONDS)
    return raised.value, time.monotonic() - started


def full_text(error: BaseException) -> str:
    """The error with its causes, as a traceback shows them."""
    return "".join(traceback.format_exception(error))


def assert_no_secret(error: BaseException, caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in full_text(error)
        assert secret not in caplog.text


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.fixture
def user(secured_kafka: SecuredEndpoints, unique_name: Callable[[str], str]) -> str:
    """A SCRAM user with `PASSWORD` and no ACL."""
    name = unique_name("user")
    secured_kafka.admin().add_user(name, PASSWORD)
    return name


@pytest.fixture
def source(secured_kafka: SecuredEndpoints, unique_name: Callable[[str], str]) -> str:
    return orders_topic(secured_kafka.internal, unique_name("orders"), 2, make_orders(20, 4))


def grant(secured_kafka: SecuredEndpoints, bindings: Iterable[AclBinding]) -> None:
    """Grant `bindings` and wait until the broker's authorizer holds them all."""
    bindings = list(bindings)
    secured_kafka.admin().grant(bindings)
    admin = AdminClient({"bootstrap.servers": secured_kafka.internal})
    principals = {binding.principal for binding in bindings}

    def held() -> bool | None:
        found = 0
        for principal in principals:
            # None matches any name and host (the stubs say str).
            any_name: Any = None
            query = AclBindingFilter(
                ResourceType.ANY,
                any_name,
                ResourcePatternType.ANY,
                principal,
                any_name,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            found += len(admin.describe_acls(query, request_timeout=10).result(timeout=15))
        return found >= len(bindings) or None

    wait_for(held, timeout=30, what="the granted ACLs to be in force")


def grant_all_but(
    secured_kafka: SecuredEndpoints, app: App, user: str, *left_out: tuple[AclResource, Operation]
) -> None:
    """Every ACL the app needs (as `dagster-stateful acls` prints them) except `left_out`."""
    needed = [
        acl
        for acl in required_acls(app.config, app.topic_specs())
        if (acl.resource_type, acl.operation) not in left_out
    ]
    grant(secured_kafka, acl_bindings(needed, f"User:{user}"))


def test_a_wrong_password_is_an_authentication_error_naming_user_and_mechanism(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs
):
    app = make_app(secured_kafka.sasl_settings(user, WRONG_PASSWORD), source, tmp_path, unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthenticationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    assert not error.retriable and (error.user, error.mechanism) == (user, "SCRAM-SHA-512")
    message = str(error)
    assert message.startswith(f"authentication failed for user {user!r} with SASL mechanism SCRAM-SHA-512"), message
    assert "sasl.username" in message and "sasl.password" in message and "unreachable" not in message
    assert_no_secret(error, debug_logs, WRONG_PASSWORD, PASSWORD)


def test_an_unknown_user_is_told_apart_only_as_far_as_kafka_allows(
    secured_kafka, source, tmp_path, unique_name, debug_logs
):
    stranger = unique_name("nobody")
    app = make_app(secured_kafka.sasl_settings(stranger, WRONG_PASSWORD), source, tmp_path, unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthenticationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    message = str(error)
    assert f"user {stranger!r}" in message and "wrong password and an unknown user alike" in message, message
    assert f"check that user {stranger!r} exists" in message
    assert_no_secret(error, debug_logs, WRONG_PASSWORD)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_mechanism_the_broker_does_not_enable_is_named(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs, mechanism
):
    settings = {**secured_kafka.sasl_settings(user, PASSWORD), "sasl.mechanism": mechanism}
    app = make_app(settings, source, tmp_path, unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthenticationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    message = str(error)
    assert f"does not enable SASL mechanism {mechanism} (it enables SCRAM-SHA-512)" in message, message
    assert "sasl.mechanism" in message
    assert_no_secret(error, debug_logs, PASSWORD)


def test_a_broker_certificate_from_an_untrusted_ca_is_a_tls_error_pointing_at_the_ca_setting(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs
):
    other_ca = untrusted_ca_certificate(tmp_path / "other-ca.pem")
    settings = {**secured_kafka.sasl_settings(user, PASSWORD), "ssl.ca.location": str(other_ca)}
    app = make_app(settings, source, tmp_path / "state", unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaTlsError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    message = str(error)
    assert f"the certificate of the broker at {secured_kafka.sasl_ssl} is not trusted" in message, message
    assert f"ssl.ca.location ({other_ca})" in message and "host name" not in message
    assert_no_secret(error, debug_logs, PASSWORD)


def test_a_host_name_the_certificate_does_not_hold_is_a_tls_mismatch(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs
):
    port = secured_kafka.sasl_ssl.rsplit(":", 1)[1]
    settings = {**secured_kafka.sasl_settings(user, PASSWORD), "bootstrap.servers": f"localhost:{port}"}
    app = make_app(settings, source, tmp_path, unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaTlsError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    message = str(error)
    assert "host name mismatch" in message and "not valid for 'localhost'" in message, message
    assert "valid for IP Address 127.0.0.1" in message, "names what the certificate holds"
    assert "ssl.endpoint.identification.algorithm=none" in message and "dangerous last resort" in message
    assert_no_secret(error, debug_logs, PASSWORD)


def test_a_worker_whose_consumer_is_refused_stops_from_its_poll_loop(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs
):
    """The admin calls log in; the worker's consumer (its own settings override the password) does not."""
    settings = secured_kafka.sasl_settings(user, PASSWORD)
    app = make_app(settings, source, tmp_path, unique_name("totals"), consumer_config={"sasl.password": WRONG_PASSWORD})
    grant_all_but(secured_kafka, app, user)

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthenticationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    assert f"while consuming {source} in consumer group {app.config.consumer_group!r}" in str(error), str(error)
    assert_no_secret(error, debug_logs, WRONG_PASSWORD, PASSWORD)


def test_admin_calls_raise_a_refused_login_at_once_instead_of_waiting_out_an_outage(secured_kafka, user, source):
    kafka = KafkaClients(secured_kafka.sasl_settings(user, WRONG_PASSWORD), admin_timeout_seconds=60)
    started = time.monotonic()

    with pytest.raises(KafkaAuthenticationError, match=f"while reading the metadata of topic {source}"):
        kafka.partition_count(source)
    first = time.monotonic() - started
    with pytest.raises(KafkaAuthenticationError, match="while listing offsets"):
        kafka.watermarks(source, [0])

    assert first < WITHIN_SECONDS and time.monotonic() - started - first < 1.0, "the second call knew at once"


def test_a_user_without_acls_is_not_authorized_to_describe_the_source(
    secured_kafka, user, source, tmp_path, unique_name, debug_logs
):
    app = make_app(secured_kafka.sasl_settings(user, PASSWORD), source, tmp_path, unique_name("totals"))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthorizationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    assert (error.operation, error.resource_type, error.resource_name) == ("Describe", "topic", source)
    assert not error.retriable and error.code_name == "TOPIC_AUTHORIZATION_FAILED"
    message = str(error)
    assert message.startswith(f"not authorized: Describe on topic {source}, while reading the metadata"), message
    assert f"dagster-stateful acls MODULE:APP --principal User:{user}" in message
    assert_no_secret(error, debug_logs, PASSWORD)


def test_a_user_without_read_on_the_group_is_not_authorized_to_join_it(
    secured_kafka, user, source, tmp_path, unique_name
):
    app = make_app(secured_kafka.sasl_settings(user, PASSWORD), source, tmp_path, unique_name("totals"))
    grant_all_but(secured_kafka, app, user, (AclResource.GROUP, Operation.READ))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthorizationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    group = app.config.consumer_group
    assert (error.operation, error.resource_type, error.resource_name) == ("Read", "group", group)
    assert f"not authorized: Read on group {group}, while consuming {source}" in str(error), str(error)
    assert "dagster-stateful acls" in str(error)


def test_a_user_without_write_on_the_changelog_is_not_authorized_to_produce_to_it(
    secured_kafka, user, source, tmp_path, unique_name
):
    app = make_app(secured_kafka.sasl_settings(user, PASSWORD), source, tmp_path, unique_name("totals"))
    grant_all_but(secured_kafka, app, user, (AclResource.TOPIC, Operation.WRITE))
    # Write on no topic: the idempotent producer needs the cluster's IdempotentWrite to get as far as writing.
    idempotent = AclBinding(
        ResourceType.BROKER,
        "kafka-cluster",
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        AclOperation.IDEMPOTENT_WRITE,
        AclPermissionType.ALLOW,
    )
    grant(secured_kafka, [idempotent])

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthorizationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    changelog = app.changelog_topic("totals")
    assert (error.operation, error.resource_type, error.resource_name) == ("Write", "topic", changelog)
    assert f"not authorized: Write on topic {changelog}, while producing to topic {changelog}" in str(error)


def test_an_idempotent_producer_without_cluster_rights_is_not_authorized(
    secured_kafka, user, source, tmp_path, unique_name
):
    app = make_app(secured_kafka.sasl_settings(user, PASSWORD), source, tmp_path, unique_name("totals"))
    grant_all_but(
        secured_kafka,
        app,
        user,
        (AclResource.TOPIC, Operation.WRITE),
        (AclResource.CLUSTER, Operation.IDEMPOTENT_WRITE),
    )

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthorizationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    assert (error.operation, error.resource_type, error.code_name) == (
        "IdempotentWrite",
        "cluster",
        "CLUSTER_AUTHORIZATION_FAILED",
    )
    assert "not authorized: IdempotentWrite on cluster kafka-cluster" in str(error), str(error)


def test_an_exactly_once_worker_without_its_transactional_ids_is_not_authorized(
    secured_kafka, user, source, tmp_path, unique_name
):
    settings = secured_kafka.sasl_settings(user, PASSWORD)
    app = make_app(settings, source, tmp_path, unique_name("totals"), processing_guarantee="exactly-once")
    grant_all_but(secured_kafka, app, user, (AclResource.TRANSACTIONAL_ID, Operation.WRITE))

    error, seconds = run_refused(app)

    assert isinstance(error, KafkaAuthorizationError), full_text(error)
    assert seconds < WITHIN_SECONDS, f"raised after {seconds:.1f} s"
    prefix = f"{app.name}-eos-"
    assert (error.operation, error.resource_type, error.resource_name) == ("Write", "transactional-id", prefix)
    message = str(error)
    assert f"not authorized: Write on transactional-id names starting with {prefix!r}" in message, message
    assert "fenced" not in message and "zombie" not in message, "not mistaken for a fenced producer"


def test_reading_committed_offsets_without_the_group_is_refused_at_once(secured_kafka, user, source, unique_name):
    group = unique_name("group")
    grant(
        secured_kafka,
        [
            AclBinding(
                ResourceType.TOPIC,
                source,
                ResourcePatternType.LITERAL,
                f"User:{user}",
                "*",
                AclOperation.DESCRIBE,
                AclPermissionType.ALLOW,
            )
        ],
    )
    kafka = KafkaClients(secured_kafka.sasl_settings(user, PASSWORD), admin_timeout_seconds=60)
    started = time.monotonic()

    with pytest.raises(KafkaAuthorizationError) as raised:
        kafka.committed_offsets(group, source, [0, 1])

    assert time.monotonic() - started < WITHIN_SECONDS
    assert (raised.value.operation, raised.value.resource_type, raised.value.resource_name) == (
        "Describe",
        "group",
        group,
    )
    assert f"not authorized: Describe on group {group}, while reading group {group!r}'s committed" in str(raised.value)
