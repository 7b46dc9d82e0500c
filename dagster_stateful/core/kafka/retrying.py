"""Admin calls retried through transient failures, and what waiting does not cure raised at once.

Owns `AdminRetries`, which runs one admin call of `clients.KafkaClients`: each try with its own
timeout, capped exponential pauses between tries (`Backoff`) for up to the admin timeout or the
run's deadline, a warning once failures last `WARN_AFTER` seconds, the topic's metadata refreshed
after an error that hints at stale leaders, and then a retriable `KafkaOperationError`. An
authentication or TLS failure a client reported, a refused ACL, and any error that is not
transient are raised at once. The first try is short (`FIRST_ATTEMPT_TIMEOUT`) and each next one
may take twice as long, up to `ATTEMPT_TIMEOUT`: a healthy cluster answers in milliseconds, and a
refused login or TLS handshake, which librdkafka's calls only see as a timeout, is then raised
within seconds (see `security.failures`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from dagster_stateful.core.kafka.error_codes import (
    STALE_METADATA,
    as_operation_error,
    gave_up_error,
    is_transient,
    kafka_error_of,
)
from dagster_stateful.core.kafka.security.acl_model import AclRequirement
from dagster_stateful.core.kafka.security.authorization import is_authorization_failure
from dagster_stateful.core.kafka.security.failures import SecurityWatch
from dagster_stateful.errors import KafkaOperationError

log = logging.getLogger(__name__)
_T = TypeVar("_T")

ATTEMPT_TIMEOUT = 10.0
"""The longest try of an admin call that may be retried within the admin timeout."""
FIRST_ATTEMPT_TIMEOUT = 2.0
"""The first try of an admin call (see the module)."""
MIN_ATTEMPT_TIMEOUT = 1.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
WARN_AFTER = 5.0
"""Failures lasting this long are logged as a warning (once per call), shorter ones at debug level."""


@dataclass
class Backoff:
    """The deadline and the capped exponential pauses of one retried admin call."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    pause: float = BACKOFF_FIRST
    attempt_cap: float = FIRST_ATTEMPT_TIMEOUT
    warned: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def attempt_timeout(self) -> float:
        return min(self.attempt_cap, max(MIN_ATTEMPT_TIMEOUT, self.remaining()))

    def sleep(self) -> None:
        time.sleep(max(0.0, min(self.pause, self.remaining())))
        self.pause = min(self.pause * 2, BACKOFF_MAX)
        self.attempt_cap = min(self.attempt_cap * 2, ATTEMPT_TIMEOUT)


class AdminRetries:
    """Runs admin calls of one client connection, retrying as the module says."""

    def __init__(
        self, admin: Callable[[], AdminClient], security: SecurityWatch, bootstrap_servers: str, seconds: float
    ) -> None:
        """seconds: how long a call may retry (the admin timeout, or the time left before a deadline)."""
        self._admin = admin
        self._security = security
        self._bootstrap_servers = bootstrap_servers
        self._seconds = seconds

    def run(
        self,
        call: Callable[[float], _T],
        what: str,
        final: Collection[int] = (),
        topic: str | None = None,
        needs: Sequence[AclRequirement] = (),
        consumer: Consumer | None = None,
        first_pause: float = BACKOFF_FIRST,
    ) -> _T:
        """Run `call(attempt timeout)`, retrying transient failures (see `errors.is_transient`, and a
        request left unanswered) with capped exponential backoff until `admin_timeout_seconds` have
        passed; then raise a retriable `KafkaOperationError` about `what`. Other errors, and codes in
        `final`, are raised at once, a refused ACL as the `KafkaAuthorizationError` of the access in
        `needs` (what `call` needs). So is an authentication or TLS failure that a client reported
        (checked after each failed try, with `consumer`'s events: the one `call` uses, if any).
        After an error that hints at stale leaders, `topic`'s metadata is refreshed before the next try."""
        backoff = Backoff(self._seconds, pause=first_pause)
        if backoff.seconds <= 0:
            raise KafkaOperationError(
                f"the run's deadline passed before {what}: a bounded worker makes no Kafka call past its max_seconds "
                "and grace",
                code=KafkaError._TIMED_OUT,
                code_name="_TIMED_OUT",
                retriable=True,
            )
        failure: Exception
        principal = self._security.identity.principal
        while True:
            self._security.check(what)
            timeout = backoff.attempt_timeout()
            try:
                return call(timeout)
            except FutureTimeoutError as error:
                last, failure = KafkaError(KafkaError._TIMED_OUT, f"no answer within {timeout:.0f} s"), error
            except KafkaException as error:
                last, failure = transient_or_raise(error, what, final, needs, principal), error
            self._raise_reported(what, needs, consumer)
            if backoff.remaining() <= 0:
                raise gave_up_error(last, what, self._bootstrap_servers, backoff.seconds) from failure
            self._log_retry(backoff, last, what)
            backoff.sleep()
            if topic is not None and last.code() in STALE_METADATA:
                self._refresh_metadata(topic, min(timeout, backoff.remaining()))

    def _raise_reported(self, what: str, needs: Sequence[AclRequirement], consumer: Consumer | None) -> None:
        """Serve the admin client's callbacks and `consumer`'s events (librdkafka reports a refused
        login or handshake, and a consumer a refused group, only there), then raise what they reported."""
        self._admin().poll(0)
        while consumer is not None and (event := consumer.poll(0)) is not None:
            error = event.error()
            if error is not None and is_authorization_failure(error):
                raise as_operation_error(KafkaException(error), what, needs, self._security.identity.principal)
        self._security.check(what)

    def _log_retry(self, backoff: Backoff, last: KafkaError, what: str) -> None:
        """A warning once failures have lasted WARN_AFTER seconds (an outage being waited out), else debug."""
        if backoff.warned or backoff.elapsed() < WARN_AFTER:
            log.debug("Retrying a Kafka admin call after %s while %s", last.name(), what)
            return
        backoff.warned = True
        log.warning(
            "Kafka at %s has failed for %.0f s while %s (%s); retrying for up to %g s in all",
            self._bootstrap_servers,
            backoff.elapsed(),
            what,
            last.name(),
            backoff.seconds,
        )

    def _refresh_metadata(self, topic: str, timeout: float) -> None:
        """Ask for the topic's metadata, which updates the admin client's cached leaders and epochs
        (after a broker restart it would otherwise send fenced leader epochs until its periodic refresh)."""
        if timeout <= 0:
            return
        try:
            self._admin().list_topics(topic, timeout=timeout)
        except KafkaException as error:
            log.debug("Refreshing the metadata of %s failed: %s", topic, error)


def transient_or_raise(
    error: KafkaException, what: str, final: Collection[int], needs: Sequence[AclRequirement], principal: str | None
) -> KafkaError:
    """Kafka's error when it is worth another try, else the `KafkaOperationError` about `what`, raised."""
    kafka_error = kafka_error_of(error)
    if kafka_error is None or not is_transient(error) or kafka_error.code() in final:
        raise as_operation_error(error, what, needs, principal) from error
    return kafka_error
