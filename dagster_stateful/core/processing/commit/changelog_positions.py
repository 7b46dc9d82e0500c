"""Where each changelog partition stands after a commit, and the committed end a commit records.

Owns `ChangelogPositions`. Once a commit's records are acknowledged, each changed changelog
partition ends after its last record: known from that record's delivery report when the producer
reports deliveries, else asked of the broker, in one query per changelog (the worker is the
partition's only writer; under exactly-once the end may include the commit's marker). Each store
records its position with the commit.

At-least-once, the same positions carry each store's `ChangelogPrefix` (`state.changelog_prefix`)
forward: a partition that grew by exactly the records this worker produced since holds nothing
else below its new end, so a commit at or past the prefix's `processed_before` records that end in
its metadata (`commit_metadata`), and restores take the records below it without reading their
headers. A partition that grew by anything else (another writer, such as a worker that lost the
partition and does not know it yet), or whose end is not known, loses its prefix until its next
restore: its commits then record no end, and restores read every header.

The records below a recorded end are read without their headers; whether a record past it is
committed is said by its own headers or its block's (`recovery.changelog_format`), never by the
metadata alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException

from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import Change, PartitionTransaction

log = logging.getLogger(__name__)

END_QUERY_SECONDS = 2.0
"""How long a commit waits for the broker to say where its changelog partitions end."""
ChangelogEnds = Callable[[str, list[int], float], dict[int, int]]
"""(topic, partitions, timeout in seconds) -> where each partition ends (see `KafkaClients.ends`)."""
Prepared = dict[int, dict[str, list[Change]]]
"""A commit's changes: source partition -> store -> changes."""


def bound_unknown_prefixes(stores: Iterable[StorePartition], source_end: Callable[[], int]) -> None:
    """Give the prefixes of restores that met records of uncommitted messages without headers their
    `processed_before`: where the source ends now (`ChangelogPrefix.resolve`). Should the broker not
    say, those stores record no changelog end until their next restore."""
    prefixes = (store.changelog_prefix for store in stores)
    unknown = [prefix for prefix in prefixes if prefix is not None and prefix.processed_before is None]
    if not unknown:
        return
    try:
        end = source_end()
    except (KafkaException, TimeoutError) as error:
        log.info("Could not read where the source ends (%s); the partition's commits record no changelog end", error)
        return
    for prefix in unknown:
        prefix.resolve(end)


class ChangelogPositions:
    def __init__(
        self,
        tracker: DeliveryTracker,
        changelog_topics: dict[str, str] | None,
        changelog_ends: ChangelogEnds | None,
        deadline: Deadline,
    ) -> None:
        self._tracker = tracker
        self._changelog_topics = changelog_topics
        self._changelog_ends = changelog_ends
        self._deadline = deadline

    @staticmethod
    def produced(txn: PartitionTransaction, changes_by_store: dict[str, list[Change]]) -> None:
        """Count the changelog records a commit produced for the partition's stores."""
        for store, changes in changes_by_store.items():
            prefix = txn.stores[store].changelog_prefix
            if prefix is not None:
                prefix.produced += len(changes)

    def after_delivery(self, prepared: Prepared) -> dict[tuple[str, int], int]:
        """Where each changed changelog partition ends once the commit's records are acknowledged. A
        partition missing from the result (the broker did not answer in time) keeps its store's
        previous changelog offset: a restore replays these records again, to the same values."""
        if self._changelog_topics is None:
            return {}
        positions: dict[tuple[str, int], int] = {}
        asked: dict[str, list[int]] = {}
        for partition, changes_by_store in prepared.items():
            for store in (store for store, changes in changes_by_store.items() if changes):
                reported = self._tracker.next_offset(self._changelog_topics[store], partition)
                if reported is None:
                    asked.setdefault(store, []).append(partition)
                else:
                    positions[(store, partition)] = reported
        for store, partitions in asked.items():
            ends = self._query_ends(self._changelog_topics[store], partitions)
            positions.update(((store, partition), end) for partition, end in ends.items())
        return positions

    def committed_ends(self, txn: PartitionTransaction, positions: dict[tuple[str, int], int]) -> dict[str, int]:
        """Per store of the partition, the changelog end below which every record is of a message
        processed before the commit's offset, as far as this worker knows (stores it knows none of are
        left out); moves each store's prefix over the records the commit produced."""
        ends: dict[str, int] = {}
        for name, store in txn.stores.items():
            prefix = store.changelog_prefix
            if prefix is None:
                continue
            if prefix.produced:
                end = positions.get((name, txn.partition))
                if end is None or end != prefix.end + prefix.produced:
                    log.info(
                        "The changelog of store %r partition %d ends at %s, not after this worker's %d records from "
                        "offset %d: restores read every record's header until its next restore",
                        name,
                        txn.partition,
                        "an unknown offset" if end is None else end,
                        prefix.produced,
                        prefix.end,
                    )
                    store.changelog_prefix = None
                    continue
                prefix.end, prefix.produced = end, 0
            if prefix.vouches_at(txn.offset_to_commit):
                ends[name] = prefix.end
        return ends

    def _query_ends(self, topic: str, partitions: list[int]) -> dict[int, int]:
        if self._changelog_ends is None:
            return {}
        try:
            return self._changelog_ends(topic, partitions, self._deadline.bound(END_QUERY_SECONDS))
        except (KafkaException, TimeoutError) as error:
            log.warning(
                "Could not read where %s partitions %s end (%s); their stores keep their changelog offsets",
                topic,
                partitions,
                str(error) or type(error).__name__,
            )
            return {}
