"""A secured development broker: SASL_SSL with SCRAM-SHA-512, mutual TLS, and ACLs denying by default.

Owns the listeners a secured broker adds (`secured_properties`), where clients reach them
(`SecuredEndpoints`, with the librdkafka settings of a SCRAM user or a mutual-TLS client) and the
administration of users and ACLs (`SecurityAdmin`). The broker runs Kafka's StandardAuthorizer
with `allow.everyone.if.no.acl.found=false`, as production clusters do: a user may do only what
an ACL grants. Clients have two listeners: `SASL_SSL` (SCRAM-SHA-512 over TLS) and `SSL` (mutual
TLS: the client certificate's common name is the principal). A third, `INTERNAL`, is plain text,
for the broker's own traffic and for administration from this machine (its principal,
`User:ANONYMOUS`, is a super user, like the user `developer` whose password the broker's home
keeps, readable by its owner only): never give it to an app.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from dagster_stateful.errors import LocalKafkaError
from dagster_stateful.local_kafka.tls import TlsMaterial
from dagster_stateful.local_processes import HOST

log = logging.getLogger(__name__)

SCRAM_MECHANISM = "SCRAM-SHA-512"
DEVELOPER = "developer"
"""The user `kafka start --secured` creates for development, with every right (a super user)."""
ADMIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class SecuredPorts:
    sasl_ssl: int
    mutual_tls: int
    internal: int
    controller: int


def secured_properties(home: Path, ports: SecuredPorts, tls: TlsMaterial) -> dict[str, str]:
    """The `server.properties` entries that secure a node (over `config.server_properties`)."""
    return {
        "listeners": (
            f"SASL_SSL://{HOST}:{ports.sasl_ssl},SSL://{HOST}:{ports.mutual_tls},"
            f"INTERNAL://{HOST}:{ports.internal},CONTROLLER://{HOST}:{ports.controller}"
        ),
        "advertised.listeners": (
            f"SASL_SSL://{HOST}:{ports.sasl_ssl},SSL://{HOST}:{ports.mutual_tls},INTERNAL://{HOST}:{ports.internal}"
        ),
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.broker_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_certificate),
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:ANONYMOUS;User:{DEVELOPER}",
    }


@dataclass(frozen=True)
class SecuredEndpoints:
    """Where a secured broker's clients connect, and with what."""

    sasl_ssl: str
    """Bootstrap address of the SASL_SSL listener (SCRAM-SHA-512)."""
    mutual_tls: str
    """Bootstrap address of the mutual-TLS listener."""
    internal: str
    """Bootstrap address of the plain-text listener for the broker and its administration."""
    home: Path

    @property
    def tls(self) -> TlsMaterial:
        return TlsMaterial(self.home / "tls")

    @property
    def ca_certificate(self) -> Path:
        return self.tls.ca_certificate

    @property
    def developer_password_file(self) -> Path:
        return self.home / "secrets" / f"{DEVELOPER}.password"

    def sasl_settings(self, user: str, password: str) -> dict[str, Any]:
        """librdkafka settings of SCRAM user `user` on the SASL_SSL listener."""
        return {
            "bootstrap.servers": self.sasl_ssl,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca_certificate),
        }

    def mutual_tls_settings(self, name: str) -> dict[str, Any]:
        """librdkafka settings of the mutual-TLS client `name` (principal `User:<name>`)."""
        certificate = self.tls.client_certificate(name)
        return {
            "bootstrap.servers": self.mutual_tls,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_certificate),
            "ssl.certificate.location": str(certificate.certificate),
            "ssl.key.location": str(certificate.key),
        }

    def admin(self) -> SecurityAdmin:
        return SecurityAdmin(self.internal)


def developer_password(home: Path) -> str:
    """The development user's password, made once and kept in the broker's home (owner-only)."""
    path = home / "secrets" / f"{DEVELOPER}.password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


class SecurityAdmin:
    """SCRAM users and ACLs of a secured broker, changed through its internal listener."""

    def __init__(self, internal_bootstrap: str) -> None:
        self._admin = AdminClient({"bootstrap.servers": internal_bootstrap})

    def add_user(self, name: str, password: str) -> None:
        """Create (or change the password of) SCRAM-SHA-512 user `name`."""
        upsert = UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        self._wait(self._admin.alter_user_scram_credentials([upsert]), f"creating SCRAM user {name!r}")

    def remove_user(self, name: str) -> None:
        deletion = UserScramCredentialDeletion(name, ScramMechanism.SCRAM_SHA_512)
        self._wait(self._admin.alter_user_scram_credentials([deletion]), f"removing SCRAM user {name!r}")

    def grant(self, bindings: Iterable[AclBinding]) -> None:
        """Create the ACLs and return once the broker's authorizer holds them (they reach it through
        the metadata log, a moment after the controller accepted them)."""
        bindings = list(bindings)
        if not bindings:
            return
        self._wait(self._admin.create_acls(bindings, request_timeout=ADMIN_TIMEOUT), "creating ACLs")
        deadline = time.monotonic() + ADMIN_TIMEOUT
        while not all(self._held(binding) for binding in bindings):
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"the broker did not apply {len(bindings)} new ACLs within {ADMIN_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def _held(self, binding: AclBinding) -> bool:
        query = AclBindingFilter(
            binding.restype,
            binding.name,
            binding.resource_pattern_type,
            binding.principal,
            binding.host,
            binding.operation,
            binding.permission_type,
        )
        return bool(self._admin.describe_acls(query, request_timeout=ADMIN_TIMEOUT).result(timeout=ADMIN_TIMEOUT))

    def revoke(self, filters: Iterable[AclBindingFilter]) -> None:
        filters = list(filters)
        if filters:
            self._wait(self._admin.delete_acls(filters, request_timeout=ADMIN_TIMEOUT), "deleting ACLs")

    @staticmethod
    def _wait(futures: dict[Any, Any], doing: str) -> None:
        for future in futures.values():
            try:
                future.result(timeout=ADMIN_TIMEOUT)
            except Exception as error:
                raise LocalKafkaError(f"{doing} on the secured development broker failed: {error}") from error
