"""Dagster resources: how a code location reaches Kafka.

Owns configuration only: `KafkaResource` turns bootstrap servers and client settings (secrets
through `EnvVar`) into confluent-kafka configuration and clients. It holds no processing logic.
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field


class KafkaResource(ConfigurableResource):
    """Connection to a Kafka cluster, shared by every asset, job and sensor of a code location."""

    bootstrap_servers: str = Field(description="Comma-separated host:port list, e.g. `127.0.0.1:9092`.")
    security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    sasl_mechanism: str | None = Field(default=None, description="e.g. PLAIN, SCRAM-SHA-512 (SASL only).")
    sasl_username: str | None = Field(default=None, description="SASL user name; pass it with `EnvVar`.")
    sasl_password: str | None = Field(default=None, description="SASL password; always pass it with `EnvVar`.")
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Further librdkafka settings applied to every client (e.g. `ssl.ca.location`).",
    )

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings common to producers, consumers and admin clients."""
        settings: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers,
                                    "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            settings["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            settings["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            settings["sasl.password"] = self.sasl_password
        settings.update(self.client_config)
        return settings

    def admin_client(self):  # -> confluent_kafka.admin.AdminClient
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_settings())
