"""librdkafka client settings as the options of Spark's Kafka source, which runs Kafka's Java client.

Owns `spark_kafka_options`: the settings the engine's clients use (`KafkaClients`, librdkafka
names) translated one by one into `kafka.<Java client setting>` options, so that the Spark jobs
reach the same cluster the same way. TLS: librdkafka's PEM files become PEM truststores and
keystores (a client certificate and its key, two files for librdkafka, are joined into one private
PEM keystore file, as the Java client reads them); `ssl.endpoint.identification.algorithm=none`
becomes the Java client's empty value. SASL: user and password become the login module's JAAS line
(PLAIN or SCRAM). Secrets never appear in an option, so neither in Spark's plan nor in what py4j
sends to the JVM (which it logs at DEBUG): they are written to a private file (`SecretsFile`,
readable by its owner only), and the options name them as `${<provider>:<file>:<key>}`, which
Kafka's `FileConfigProvider` resolves inside the JVM. The file must be readable where the
executors run: on one machine it is; on a cluster, give the secret through `extra` instead (for
instance Kafka's `EnvVarConfigProvider`). A security setting without a translation (Kerberos,
OAUTHBEARER, a CA directory) raises `ConfigurationError` naming it and what to do; other
librdkafka-only settings (tuning) are left out, with a warning naming them.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)

PROVIDER = "dagsterstatefulsecrets"
"""The config provider's name in the options (`config.providers`)."""
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_SAME_NAME = frozenset({"bootstrap.servers", "security.protocol", "client.id", "client.rack"})
_TRANSLATED = frozenset(
    {
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
    }
)
_SECURITY_PREFIXES = ("ssl.", "sasl.", "enable.ssl")


class SecretsFile:
    """A private properties file (mode 600, in a directory of mode 700) of the secrets that options
    name, removed when the process exits."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="dagster-stateful-kafka-"))
        atexit.register(shutil.rmtree, self.directory, True)
        self._secrets: dict[str, str] = {}

    @property
    def properties(self) -> Path:
        return self.directory / "client-secrets.properties"

    def reference(self, key: str, secret: str) -> str:
        """Keep `secret` under `key`; returns what an option holds instead of it."""
        self._secrets[key] = secret
        self._write(self.properties, "".join(f"{k}={_escape(v)}\n" for k, v in self._secrets.items()).encode())
        return f"${{{PROVIDER}:{self.properties}:{key}}}"

    def private_copy(self, name: str, content: bytes) -> Path:
        """A private file holding `content` (a key for a keystore)."""
        path = self.directory / name
        self._write(path, content)
        return path

    @staticmethod
    def _write(path: Path, content: bytes) -> None:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)


@functools.cache
def process_secrets() -> SecretsFile:
    """This process's secrets file (one per process, removed when it exits)."""
    return SecretsFile()


def spark_kafka_options(
    settings: Mapping[str, Any], secrets: SecretsFile, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`settings` (librdkafka's names) as `kafka.*` options of Spark's Kafka source; `extra`: Java
    client settings added as they are (winning over the translated ones)."""
    settings = {key: str(value) for key, value in settings.items()}
    java: dict[str, str] = {key: value for key, value in settings.items() if key in _SAME_NAME}
    java |= _sasl(settings, secrets)
    java |= _tls(settings, secrets)
    _refuse_or_warn(settings)
    if any(PROVIDER in value for value in java.values()):
        java["config.providers"] = PROVIDER
        java[f"config.providers.{PROVIDER}.class"] = "org.apache.kafka.common.config.provider.FileConfigProvider"
    java |= dict(extra or {})
    return {f"kafka.{key}": value for key, value in java.items()}


def _sasl(settings: Mapping[str, str], secrets: SecretsFile) -> dict[str, str]:
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms"))
    if mechanism is None:
        return {}
    java = {"sasl.mechanism": mechanism}
    user, password = settings.get("sasl.username"), settings.get("sasl.password")
    if user is None and password is None:
        return java
    module = _LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise ConfigurationError(
            f"SASL mechanism {mechanism} has no translation for Spark's Kafka client (PLAIN and SCRAM-SHA-256/512 "
            "do): give Spark the Java client's `sasl.jaas.config` and its settings yourself, in the resource's "
            "spark_kafka_config"
        )
    reference = secrets.reference("sasl.password", password or "")
    java["sasl.jaas.config"] = f'{module} required username="{_jaas_quote(user or "")}" password="{reference}";'
    return java


def _tls(settings: Mapping[str, str], secrets: SecretsFile) -> dict[str, str]:
    java = _truststore(settings.get("ssl.ca.location")) | _keystore(settings, secrets)
    algorithm = settings.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        java["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    return java


def _truststore(ca: str | None) -> dict[str, str]:
    if ca is None:
        return {}
    if ca == "probe" or Path(ca).is_dir():
        raise ConfigurationError(
            f"ssl.ca.location={ca!r} (a directory, or the system's store) has no translation for Spark's Kafka "
            "client, which reads one PEM file of CA certificates: name such a file in ssl.ca.location"
        )
    return {"ssl.truststore.type": "PEM", "ssl.truststore.location": ca}


def _keystore(settings: Mapping[str, str], secrets: SecretsFile) -> dict[str, str]:
    """The client certificate of mutual TLS: PEM files joined into one private file, or a PKCS#12 keystore."""
    certificate, key = settings.get("ssl.certificate.location"), settings.get("ssl.key.location")
    if (certificate is None) != (key is None):
        raise ConfigurationError("a client certificate needs both ssl.certificate.location and ssl.key.location")
    java: dict[str, str] = {}
    if certificate is not None and key is not None:
        keystore = secrets.private_copy("client-keystore.pem", Path(key).read_bytes() + Path(certificate).read_bytes())
        java |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}
    elif "ssl.keystore.location" in settings:
        java |= {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": settings["ssl.keystore.location"]}
    for password in ("ssl.key.password", "ssl.keystore.password"):
        if password in settings and java:
            java[password] = secrets.reference(password, settings[password])
    return java


def _refuse_or_warn(settings: Mapping[str, str]) -> None:
    untranslated = [key for key in settings if key not in _SAME_NAME and key not in _TRANSLATED]
    security = [key for key in untranslated if key.startswith(_SECURITY_PREFIXES)]
    if security:
        raise ConfigurationError(
            f"librdkafka settings {security} have no translation for Spark's Kafka client (a Java client): give "
            "Spark the Java client's equivalent in the resource's spark_kafka_config, or remove them"
        )
    if untranslated:
        log.warning("Left out of Spark's Kafka options (librdkafka settings, not the Java client's): %s", untranslated)


def _escape(value: str) -> str:
    """A value as a Java properties file reads it back unchanged."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")
    return "\\" + escaped if escaped[:1].isspace() else escaped


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
