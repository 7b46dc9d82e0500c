"""Which replay a store partition needs, and the consumer every replay reads through.

Owns `Restorer`: given an open store partition and where the group's last commit left it, `begin()`
says what it lacks (nothing, the tail after its stored changelog offset, or the whole changelog)
and returns the `changelog_replay.ChangelogRestore` that replays it, through one assign-only consumer;
`restore()` runs one to the end. Inconsistencies an operator must decide on (a stored offset
beyond the changelog's end) are raised with the options.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreReport
from dagster_stateful.core.recovery.changelog_replay import FULL_RESTORE_CHUNK_RECORDS, ChangelogRestore
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

METADATA_TIMEOUT = 10.0


def _recreated_changelog_error(store: StorePartition, stored: int, high: int) -> RecoveryError:
    topic, partition = store.changelog_topic, store.partition
    return RecoveryError(
        f"store {store.store!r} partition {partition} at {store.path} has changelog offset {stored}, beyond the end "
        f"({high}) of {topic}[{partition}]: the changelog was probably deleted and recreated, so it no longer holds "
        "the state committed before. Nothing was processed or committed. Options: (1) reprocess the source from its "
        "beginning, which loses nothing while the source still holds every message: stop every worker of the app, "
        "clear the local state on every machine that has some (App.clear_state() or the clear-state job) and delete "
        f"the app's consumer group offsets for {store.source_topic} (`kafka-consumer-groups --delete-offsets --group "
        f"<the app's consumer group> --topic {store.source_topic} --execute`), then run the worker; (2) accept the "
        "loss: clear only the local state and restore from what the new changelog holds, which LOSES every count "
        "committed before the changelog was recreated (the group's offsets stay where they are)."
    )


class Restorer:
    """Restores store partitions through one dedicated, assign-only consumer."""

    def __init__(
        self,
        kafka: KafkaClients,
        consumer: Consumer,
        listeners: Listeners,
        batch_size: int = 10_000,
        chunk_records: int = FULL_RESTORE_CHUNK_RECORDS,
        group: str = "",
    ) -> None:
        """group: `consumer`'s group id, named when Kafka refuses it."""
        self._kafka = kafka
        self._group = group
        self._consumer = consumer
        self._listeners = listeners
        self._batch_size = batch_size
        self._chunk_records = chunk_records
        self._known_topics: set[str] = set()

    @property
    def group(self) -> str:
        return self._group

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def begin(
        self,
        store: StorePartition,
        committed_source_offset: int | None,
        committed_end: int | None = None,
        bare_uncommitted: bool = False,
    ) -> ChangelogRestore | None:
        """The replay the (open) store partition needs; None when it is up to date (nothing to read).
        committed_end: the changelog end the group's last commit recorded (`commit_metadata`), if any;
        bare_uncommitted: that commit counts records without headers past it as uncommitted."""
        topic, partition = store.changelog_topic, store.partition
        store.changelog_prefix = None
        low, high = self._kafka.watermarks(topic, [partition], committed=True)[partition]
        if committed_end is not None and committed_end > high:
            log.warning(
                "The last commit of store %r partition %d recorded changelog end %d, past the end (%d) of %s; "
                "reading every record's header",
                store.store,
                partition,
                committed_end,
                high,
                topic,
            )
            committed_end = None
        stored = store.changelog_offset
        if stored is not None and stored > high:
            raise _recreated_changelog_error(store, stored, high)
        if stored is not None and stored < low:
            log.warning(
                "Store %r partition %d: stored changelog offset %d is below the changelog's low watermark "
                "%d (records were deleted); restoring the partition fully",
                store.store,
                partition,
                stored,
                low,
            )
            store.start_fresh()
            stored = None
        start = stored if stored is not None else low
        clean_base = stored is None or (committed_end is not None and stored <= committed_end)
        if start >= high:
            if stored is None or store.source_offset != committed_source_offset:
                store.finish_restore(high, committed_source_offset)
            if clean_base:
                store.changelog_prefix = ChangelogPrefix.read(high, committed_source_offset)
            return None
        self._learn_topic(topic)
        return ChangelogRestore(
            self._consumer,
            self._listeners,
            store,
            committed_source_offset,
            start,
            high,
            self._batch_size,
            self._chunk_records,
            self._group,
            committed_end,
            clean_base,
            bare_uncommitted,
        )

    def _learn_topic(self, topic: str) -> None:
        """Have the consumer fetch the topic's metadata now: a partition of a topic it has no metadata
        for is fetched only after its next periodic metadata refresh, up to a second later."""
        if topic in self._known_topics:
            return
        try:
            self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT)
        except KafkaException as error:  # the first fetch then waits for the refresh, nothing worse
            log.debug("Could not read the metadata of %s ahead of its restore: %s", topic, error)
            return
        self._known_topics.add(topic)

    def restore(
        self,
        store: StorePartition,
        committed_source_offset: int | None,
        committed_end: int | None = None,
        bare_uncommitted: bool = False,
    ) -> RestoreReport | None:
        """Replay what the store lacks, to the end; None when it was already up to date."""
        replay = self.begin(store, committed_source_offset, committed_end, bare_uncommitted)
        if replay is None:
            return None
        try:
            while not replay.done:
                replay.step()
        except BaseException:
            replay.suspend()
            raise
        return replay.finish()
