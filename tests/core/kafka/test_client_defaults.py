"""The settings every client of the Kafka adapter gets unless the connection's settings say otherwise."""

from __future__ import annotations

from dagster_stateful.core.kafka.clients import REBOOTSTRAP_AFTER_MS, KafkaClients

TRIGGER = "metadata.recovery.rebootstrap.trigger.ms"


def test_a_client_left_without_brokers_bootstraps_again_within_seconds_unless_the_connection_says_otherwise():
    clients = KafkaClients({"bootstrap.servers": "127.0.0.1:9"})
    for own in (None, {"group.id": "g"}):
        assert clients._client_config(own)[TRIGGER] == REBOOTSTRAP_AFTER_MS <= 10_000
    tuned = KafkaClients({"bootstrap.servers": "127.0.0.1:9", TRIGGER: 60_000})
    assert tuned._client_config({"group.id": "g"})[TRIGGER] == 60_000
