"""Authentication and TLS failures: noticed within a second or two, raised as what they are.

Owns `SecurityWatch`, the `error_cb` of every client a `KafkaClients` makes (admin, producers,
consumers), and the errors it raises. librdkafka 2.16 reports a refused SASL login
(`_AUTHENTICATION`: invalid credentials, an unknown user, a mechanism the broker does not enable)
and a failed TLS handshake (`_SSL`; a broker refusing the client's certificate comes as
`_TRANSPORT` with a TLS alert) only there, within about 0.3 s of connecting, while its calls just
time out as if the brokers were unreachable. An `error_cb` runs only when its client is polled: the
consumers' in `consume`, the producers' in `poll`/`flush`, the admin client's when `KafkaClients`
polls it after an admin call's failed attempt. The watch keeps the first such failure for all the
clients of one connection, and the engine's own code raises it (`check`): after each failed attempt
of an admin call and in the worker's poll loop, as a `KafkaAuthenticationError` or `KafkaTlsError`
that says what failed and what to change. Other errors reported there are logged, as librdkafka
logs them without an `error_cb`. The watch keeps the non-secret part of the settings only
(`ClientIdentity`): never a password.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from dagster_stateful.core.kafka.security.tls_probe import (
    CertificateVerdict,
    TrustSettings,
    diagnose_certificate,
    split_address,
)
from dagster_stateful.errors import KafkaAuthenticationError, KafkaSecurityError, KafkaTlsError

log = logging.getLogger(f"{__name__.rsplit('.', 1)[0]}.librdkafka")

AUTHENTICATION_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
TLS_CODES = frozenset({KafkaError._SSL})
TLS_ALERTS = ("certificate verify failed", "alert bad certificate", "alert certificate required", "alert unknown ca")
"""What a `_TRANSPORT` error's text holds when a TLS handshake failed on a certificate."""
_BROKER = re.compile(r"^(?:\w+://)?(?P<address>[^/\s]+)/\S*: ")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")
_ENABLED = re.compile(r"supported mechanisms: (?P<mechanisms>[\w\-, ]+)")


@dataclass(frozen=True)
class ClientIdentity:
    """Who a client is and whom it trusts, from its librdkafka settings, without any secret."""

    bootstrap: str
    protocol: str
    mechanism: str | None
    user: str | None
    trust: TrustSettings

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> ClientIdentity:
        protocol = str(settings.get("security.protocol", "plaintext")).upper()
        mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms"))
        if mechanism is None and protocol.startswith("SASL"):
            mechanism = "GSSAPI"  # librdkafka's default
        check_host = str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() != "none"
        pem = settings.get("ssl.ca.pem")
        location = settings.get("ssl.ca.location")
        trust = TrustSettings(
            None if location is None else str(location), None if pem is None else str(pem), check_host
        )
        user = settings.get("sasl.username")
        return cls(str(settings["bootstrap.servers"]), protocol, mechanism, None if user is None else str(user), trust)

    @property
    def principal(self) -> str | None:
        """Kafka's principal of a SASL user (a mutual-TLS client's comes from its certificate: unknown here)."""
        return None if self.user is None else f"User:{self.user}"


@dataclass(frozen=True)
class SecurityFailure:
    """An authentication or TLS failure as librdkafka reported it."""

    code: int
    code_name: str
    reason: str
    """librdkafka's text, without the broker prefix and the state suffix."""
    broker: str | None
    """The address of the broker that refused ("host:port"), when the text names it."""

    @classmethod
    def of(cls, error: KafkaError) -> SecurityFailure:
        text = error.str()
        found = _BROKER.match(text)
        reason = _AFTER.sub("", text[found.end() :] if found else text)
        return cls(error.code(), error.name(), reason, found.group("address") if found else None)

    @property
    def is_authentication(self) -> bool:
        return self.code in AUTHENTICATION_CODES


def is_security_failure(error: KafkaError) -> bool:
    """Authentication refused, or a TLS handshake failed (not an outage: waiting does not help)."""
    code = error.code()
    if code in AUTHENTICATION_CODES or code in TLS_CODES:
        return True
    return code == KafkaError._TRANSPORT and any(alert in error.str() for alert in TLS_ALERTS)


class SecurityWatch:
    """The first authentication or TLS failure any client of one connection met (see the module)."""

    def __init__(self, identity: ClientIdentity) -> None:
        self.identity = identity
        self.failure: SecurityFailure | None = None
        self._lock = threading.Lock()
        self._verdict: CertificateVerdict | None = None

    def error_callback(self, chained: Callable[[KafkaError], object] | None = None) -> Callable[[KafkaError], None]:
        """A client's `error_cb`: records security failures, logs the rest, then calls `chained`
        (an `error_cb` of the app's own settings)."""

        def on_error(error: KafkaError) -> None:
            self.record(error)
            if chained is not None:
                chained(error)

        return on_error

    def record(self, error: KafkaError) -> None:
        """Keep the first security failure (logged; its repeats, as librdkafka retries, at debug level)."""
        first = False
        if is_security_failure(error):
            with self._lock:
                first = self.failure is None
                if first:
                    self.failure = SecurityFailure.of(error)
            if not first:
                log.debug("%s: %s", error.name(), error.str())
                return
        log.warning("%s: %s", error.name(), error.str())

    def check(self, doing: str) -> None:
        """Raise the recorded failure (if any) as the error of `doing`."""
        if self.failure is not None:
            raise self.error(self.failure, doing)

    def error(self, failure: SecurityFailure, doing: str) -> KafkaSecurityError:
        broker = failure.broker or self.identity.bootstrap
        if failure.is_authentication:
            return authentication_error(failure, self.identity, broker, doing)
        if self._verdict is None and "certificate verify failed" in failure.reason:
            self._verdict = diagnose_certificate(broker, self.identity.trust)
        return tls_error(failure, self.identity, broker, doing, self._verdict)


def authentication_error(
    failure: SecurityFailure, identity: ClientIdentity, broker: str, doing: str
) -> KafkaAuthenticationError:
    user, mechanism = identity.user, identity.mechanism
    enabled = _ENABLED.search(failure.reason)
    if enabled is not None or "unsupported sasl mechanism" in failure.reason.lower():
        brokers_list = f" (it enables {enabled.group('mechanisms').strip()})" if enabled else ""
        message = (
            f"authentication failed: the broker at {broker} does not enable SASL mechanism {mechanism}{brokers_list}, "
            f"while {doing}. Set sasl.mechanism (the Kafka resource's sasl_mechanism) to a mechanism the brokers "
            f"enable, or have {mechanism} enabled on the brokers (sasl.enabled.mechanisms)."
        )
    elif "invalid credentials" in failure.reason.lower():
        message = (
            f"authentication failed for user {user!r} with SASL mechanism {mechanism}: the broker at {broker} "
            f"refused the credentials, while {doing}. Kafka reports a wrong password and an unknown user alike, as "
            f"invalid credentials: check that user {user!r} exists on the cluster for {mechanism} and that "
            "sasl.username and sasl.password (the Kafka resource's sasl_username and sasl_password) are right."
        )
    else:
        message = (
            f"authentication failed for user {user!r} with SASL mechanism {mechanism} at the broker at {broker}, "
            f"while {doing}: {failure.reason}. Check sasl.mechanism, sasl.username and sasl.password (the Kafka "
            "resource's sasl_mechanism, sasl_username and sasl_password)."
        )
    return KafkaAuthenticationError(message, failure.code, failure.code_name, broker, user, mechanism)


def tls_error(
    failure: SecurityFailure, identity: ClientIdentity, broker: str, doing: str, verdict: CertificateVerdict | None
) -> KafkaTlsError:
    trust = identity.trust
    if verdict is not None and verdict.trusted is False:
        message = (
            f"TLS error: the certificate of the broker at {broker} is not trusted ({verdict.detail}), while {doing}. "
            f"The client trusts {trust.source}: set ssl.ca.location (in the Kafka resource's client_config) to the "
            "CA certificate that signed the brokers' certificates."
        )
    elif verdict is not None and verdict.host_matches is False:
        message = _host_mismatch(broker, doing, verdict)
    elif "certificate verify failed" in failure.reason:
        message = (
            f"TLS error: the certificate of the broker at {broker} could not be verified ({failure.reason}), while "
            f"{doing}. Either it is not signed by a CA the client trusts ({trust.source}: point ssl.ca.location at "
            "the CA that signed it), or it is not valid for the name the client connected to (connect by a name in "
            "the certificate). " + (f"({verdict.detail}.)" if verdict is not None else "")
        )
    elif any(alert in failure.reason for alert in TLS_ALERTS):
        message = (
            f"TLS error: the broker at {broker} refused this client's certificate ({failure.reason}), while {doing}. "
            "The brokers require a client certificate signed by a CA they trust (their ssl.truststore): check "
            "ssl.certificate.location and ssl.key.location."
        )
    else:
        message = (
            f"TLS error: the TLS handshake with the broker at {broker} failed ({failure.reason}), while {doing}. "
            f"Check that {broker} is a TLS listener (security.protocol is {identity.protocol}) and the client's "
            "ssl.* settings."
        )
    return KafkaTlsError(message, failure.code, failure.code_name, broker)


def _host_mismatch(broker: str, doing: str, verdict: CertificateVerdict) -> str:
    host = split_address(broker)[0]
    names = f"; it is valid for {', '.join(verdict.names)}" if verdict.names else ""
    return (
        f"TLS error: host name mismatch: the certificate of the broker at {broker} is not valid for {host!r} "
        f"({verdict.detail.rstrip('.')}{names}), while {doing}. Connect to the brokers by a name their certificate "
        f"holds (in bootstrap.servers, and in the brokers' advertised.listeners), or have the certificate reissued "
        f"for {host!r}. Turning the check off (ssl.endpoint.identification.algorithm=none) lets anyone who can "
        "intercept the connection pose as the brokers: a dangerous last resort only."
    )
