"""Purging a repartition topic of what the app has consumed and committed.

Owns `RepartitionPurge`. A repartition topic keeps its records until deleted (`retention.ms=-1`),
so that none is lost however long a worker is down; once the group has committed past them, they
are never read again. After a commit, at most every `REPARTITION_PURGE_INTERVAL_SECONDS` (Kafka
Streams' `repartition.purge.interval.ms`), the worker asks the brokers to delete the records
below each committed offset of the partitions it holds (DeleteRecords). The request runs in the
background; a refusal (the Delete ACL on the topic is missing, say) is logged once as a warning
and the topic simply keeps its records.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

from confluent_kafka import TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients

log = logging.getLogger(__name__)

REPARTITION_PURGE_INTERVAL_SECONDS = 30.0


class RepartitionPurge:
    def __init__(self, kafka: KafkaClients, topic: str, interval: float = REPARTITION_PURGE_INTERVAL_SECONDS) -> None:
        self._kafka = kafka
        self.topic = topic
        self._interval = interval
        self._due: dict[int, int] = {}
        """Committed offsets not purged up to yet, by partition."""
        self._last = time.monotonic()
        self._warned = False
        self.requests = 0
        """Purge requests sent."""

    @classmethod
    def of_app(cls, config: AppConfig, kafka: KafkaClients) -> RepartitionPurge | None:
        """The purge of the app's repartition topic (None: the app does not re-key)."""
        topic = config.repartition_topic
        return None if topic is None else cls(kafka, topic, config.repartition_purge_interval)

    def committed(self, offsets: dict[int, int]) -> None:
        """The group committed these offsets of the repartition topic: purge below them when due."""
        self._due.update(offsets)
        if not self._due or time.monotonic() - self._last < self._interval:
            return
        self.purge()

    def purge(self) -> None:
        """Ask now for the records below the committed offsets to be deleted (in the background)."""
        due, self._due, self._last = self._due, {}, time.monotonic()
        if not due:
            return
        requested = [TopicPartition(self.topic, partition, offset) for partition, offset in sorted(due.items())]
        self.requests += 1
        try:
            futures = self._kafka.admin().delete_records(requested, request_timeout=self._kafka.admin_timeout_seconds)
        except Exception as error:  # noqa: BLE001 - a purge that fails only leaves records behind
            self._warn(error)
            return
        for future in futures.values():
            future.add_done_callback(self._check)

    def _check(self, future: Future[object]) -> None:
        error = future.exception()
        if error is not None:
            self._warn(error)

    def _warn(self, error: BaseException) -> None:
        if self._warned:
            log.debug("Purging %s failed again: %s", self.topic, error)
            return
        self._warned = True
        log.warning(
            "Could not purge the consumed records of repartition topic %s (%s); the topic keeps them until a purge "
            "succeeds. The app needs the Delete ACL on it (`dagster-stateful acls` lists it).",
            self.topic,
            error,
        )
