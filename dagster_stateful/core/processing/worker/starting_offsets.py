"""Where processing of a newly assigned source partition starts.

Owns `StartingOffsets`, which the rebalance callbacks (`rebalance.PartitionAssignments`) ask on
assignment: the group's committed offsets (read through a consumer of the group that never joins
it, retried a few times), refused when below the source's low watermark (messages deleted before
they were processed); a missing one resumes from the offset the local state was committed at, or
stops with the operator's options (`MissingOffsets`); and local state ahead of the starting offset
(offsets reset) is wiped, to be rebuilt from the changelog.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

from dagster_stateful.core.config import AppConfig, MissingOffsets
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

__all__ = ["COMMITTED_TIMEOUT", "COMMITTED_WAIT", "StartingOffsets", "committed_wait_seconds", "reset_position"]

log = logging.getLogger(__name__)

COMMITTED_TIMEOUT = 15.0
"""One try at reading the group's committed offsets."""
COMMITTED_WAIT = 45.0
"""How long reading them keeps trying, at least (a coordinator moving or loading)."""
TRANSACTION_CLEANUP_SECONDS = 10.0
"""How late after its timeout the broker may abort a transaction (Kafka's default
`transaction.abort.timed.out.transaction.cleanup.interval.ms`)."""


RESET_POSITIONS = {
    **dict.fromkeys(("earliest", "smallest", "beginning"), OFFSET_BEGINNING),
    **dict.fromkeys(("latest", "largest", "end"), OFFSET_END),
}
"""The logical offset each `auto.offset.reset` setting starts a partition without a committed offset at."""


def reset_position(config: AppConfig) -> int | None:
    """Where the worker's consumer starts a partition that has no committed offset, as a logical
    offset to seek to (None for `auto.offset.reset=error`: it fails instead)."""
    return RESET_POSITIONS.get(str(config.consumer_config.get("auto.offset.reset", "earliest")))


def committed_wait_seconds(config: AppConfig) -> float:
    """How long reading committed offsets may keep trying. Under exactly-once, a partition's previous
    owner killed inside a commit leaves its offsets in an open transaction, which `read_committed`
    readers see as unstable until the broker aborts it, up to `transaction.timeout.ms` (and its
    clean-up interval) later: the new owner waits that long, as Kafka Streams' does."""
    if not config.exactly_once:
        return COMMITTED_WAIT
    return max(COMMITTED_WAIT, config.transaction_timeout_ms / 1000 + TRANSACTION_CLEANUP_SECONDS + COMMITTED_TIMEOUT)


class StartingOffsets:
    """The offsets a worker's newly assigned partitions start from, and the local state made to agree."""

    def __init__(self, config: AppConfig, kafka: KafkaClients, state: StateDirectory, offset_reader: Consumer) -> None:
        self.config = config
        self._kafka = kafka
        self._state = state
        self._offset_reader = offset_reader

    def committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The group's committed offsets of `partitions` (a negative offset: none)."""
        # Not the subscribed consumer: its committed() can stall until timeout inside a cooperative
        # rebalance callback. A second consumer of the group that never joins it reads the same offsets.
        started = time.monotonic()
        wait = committed_wait_seconds(self.config)
        while True:
            left = wait - (time.monotonic() - started)
            try:  # a bounded worker's deadline cuts the wait short
                timeout = self._kafka.time_left(min(COMMITTED_TIMEOUT, max(left, 0.1)), 0.1)
                return self._offset_reader.committed(partitions, timeout=timeout)
            except KafkaException as error:
                waited = time.monotonic() - started
                if waited >= wait or self._kafka.time_left(COMMITTED_TIMEOUT) <= 0:
                    raise self._unreadable(partitions, waited, error) from error
                log.warning(
                    "Reading group %r's committed offsets for %s partitions %s failed (%s); retrying for up to %.0f s "
                    "in all%s",
                    self.config.consumer_group,
                    self.config.task_topic,
                    [tp.partition for tp in partitions],
                    error,
                    wait,
                    " (a transaction a dead worker left open keeps them unstable until it times out)"
                    if self.config.exactly_once
                    else "",
                )

    def _unreadable(self, partitions: list[TopicPartition], waited: float, error: KafkaException) -> RecoveryError:
        return RecoveryError(
            f"could not read group {self.config.consumer_group!r}'s committed offsets for {self.config.task_topic} "
            f"partitions {[tp.partition for tp in partitions]} in {waited:.0f} s ({error}); is the group coordinator "
            "reachable?"
            + (
                " Under exactly-once, a transaction left open by a worker that died in a commit keeps them unstable "
                f"until transaction.timeout.ms ({self.config.transaction_timeout_ms} ms) passes."
                if self.config.exactly_once
                else ""
            )
        )

    def check_source_offset(self, partition: int, committed: int | None) -> None:
        """Refuse a committed offset below the source partition's low watermark."""
        if committed is None:
            return
        low, _ = self._kafka.watermarks(self.config.task_topic, [partition])[partition]
        if committed < low:
            raise RecoveryError(
                f"group {self.config.consumer_group!r} committed offset {committed} on "
                f"{self.config.task_topic}[{partition}], "
                f"below the topic's low watermark {low}: messages {committed}..{low - 1} were deleted (retention) "
                "before they were processed. Options: accept the gap and move the group to the low watermark "
                f"(`kafka-consumer-groups --reset-offsets --to-earliest --group {self.config.consumer_group} "
                f"--topic {self.config.task_topic}:{partition} --execute`), or reprocess from a source that still "
                "holds them."
            )

    def starting_offset(self, partition: int, committed: int | None, stores: dict[str, StorePartition]) -> int | None:
        """The offset processing starts from (None: the source's beginning), given the group's
        committed one and the partition's open stores."""
        if committed is not None:
            return committed
        local = sorted({store.source_offset for store in stores.values() if store.source_offset is not None})
        if not local:
            return None  # nothing committed: processing starts from the beginning and rebuilds the state
        where = f"{self.config.task_topic}[{partition}]"
        if self.config.missing_offsets is MissingOffsets.FAIL:
            raise RecoveryError(
                f"group {self.config.consumer_group!r} has no committed offset on {where}, but the local state at "
                f"{self._state.app_dir} was committed at source offset {local[0]} (the group's offsets expired "
                "after offsets.retention.minutes, or were deleted). Options: (1) set the group's offset to it "
                f"(`kafka-consumer-groups --reset-offsets --to-offset {local[0]} --group "
                f"{self.config.consumer_group} --topic {self.config.task_topic}:{partition} --execute`); (2) run with "
                "missing_offsets='resume-from-state', which does that by itself; (3) clear the state and the "
                "changelog to reprocess from the source's beginning."
            )
        log.warning(
            "Group %r has no committed offset on %s (expired or deleted); resuming from source offset %d, where "
            "the local state was committed",
            self.config.consumer_group,
            where,
            local[0],
        )
        return local[0]

    def wipe_ahead(self, partition: int, start: int | None, stores: dict[str, StorePartition]) -> None:
        """Wipe (and reopen empty) the stores holding state past `start`: the changelog rebuilds them."""
        for name, store in stores.items():
            if store.source_offset is not None and store.source_offset > (start or 0):
                log.warning(
                    "Store %r partition %d holds state up to source offset %d but processing starts at %s "
                    "(offsets were reset?); rebuilding it from the changelog",
                    name,
                    partition,
                    store.source_offset,
                    start,
                )
                store.start_fresh(lock_timeout=0)
