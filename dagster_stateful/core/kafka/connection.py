"""How an app is told where Kafka is: a `KafkaClients`, a librdkafka configuration, a bootstrap
string, or nothing (then `KAFKA_BOOTSTRAP_SERVERS`).

Owns `KafkaConnection` and `kafka_clients`, which turns any of those into the app's clients.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.errors import ConfigurationError

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"

KafkaConnection = KafkaClients | Mapping[str, Any] | str


def kafka_clients(kafka: KafkaConnection | None) -> KafkaClients:
    """The clients `kafka` names; with None, those of the cluster `KAFKA_BOOTSTRAP_SERVERS` names."""
    if isinstance(kafka, KafkaClients):
        return kafka
    if isinstance(kafka, str):
        return KafkaClients({"bootstrap.servers": kafka})
    if kafka is not None:
        return KafkaClients(kafka)
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise ConfigurationError(f"no Kafka connection: pass kafka= to App or set {BOOTSTRAP_ENV}")
    return KafkaClients({"bootstrap.servers": bootstrap})
