"""The source offsets of an at-least-once commit, committed with their metadata.

Owns `SourceCommit` and `CommitDeferred`. The commit is synchronous, on the worker's own thread
(see `commit`). A group that is rebalancing (or moved on) or a coordinator out of reach defers it
(`CommitDeferred`: nothing was committed, the next commit retries); a refused ACL raises the
`KafkaAuthorizationError` naming it. A broker that refuses the metadata as too large (its
`offset.metadata.max.bytes`) gets the same offsets again with shorter metadata
(`commit_metadata.MetadataLimit`, which leaves the changelog ends out); when even the stream times
do not fit, the commit raises a `ConfigurationError` naming the limit and the stores.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.authorization import authorization_error, is_authorization_failure
from dagster_stateful.core.state.commit_metadata import MetadataLimit
from dagster_stateful.errors import ConfigurationError

METADATA_ATTEMPTS = 3
"""Commits of the same offsets with shorter metadata, after the broker refused it as too large."""
_RETRIABLE_COMMIT_ERRORS = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
    # The coordinator is away (a broker outage, a moving coordinator): the next commit retries.
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
}


class CommitDeferred(Exception):
    """The group is rebalancing (or moved on), or its coordinator is unreachable: the source commit
    did not happen and nothing else was written.

    The transactions keep their changes and the next commit retries; changelog records already
    sent carry processed offsets at or past the committed offset, so a restore treats them as
    records of uncommitted messages (see `recovery.uncommitted`).
    """


class SourceCommit:
    def __init__(self, consumer: Consumer, source_topic: str, group: str | None) -> None:
        self._consumer = consumer
        self._source_topic = source_topic
        self._group = group
        self.metadata = MetadataLimit()
        """How long the commits' metadata may be: the offsets to commit encode theirs with it."""

    def commit(self, offsets: Callable[[], list[TopicPartition]]) -> None:
        """Commit the `offsets()`, built again with shorter metadata while the broker refuses it as too large."""
        for _ in range(METADATA_ATTEMPTS):
            built = offsets()
            if self._commit(built):
                return
            self.metadata.refused(_longest_metadata(built))
        raise self._metadata_refused(built)

    def _commit(self, offsets: list[TopicPartition]) -> bool:
        """Commit `offsets`; False when the broker refused their metadata as too large."""
        try:
            # On the worker's own thread: a commit made from another one while this thread waits
            # (serving no rebalance callback) stalled a cooperative rebalance for minutes.
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
            if kafka_error is None:
                raise
            return self._refused(kafka_error, error)
        for refused in (tp.error for tp in result or () if tp.error is not None):
            return self._refused(refused, KafkaException(refused))
        return True

    def _refused(self, kafka_error: KafkaError, error: KafkaException) -> bool:
        """False for metadata too large; raises what the other refusals of a source commit mean."""
        if kafka_error.code() == KafkaError.OFFSET_METADATA_TOO_LARGE:
            return False
        if is_authorization_failure(kafka_error):
            doing = f"committing the offsets of {self._source_topic} in consumer group {self._group!r}"
            needs = [AclRequirement(ResourceType.GROUP, self._group, Operation.READ)] if self._group else []
            raise authorization_error(kafka_error, doing, needs) from error
        if kafka_error.code() not in _RETRIABLE_COMMIT_ERRORS:
            raise error
        raise CommitDeferred(kafka_error.str()) from error

    def _metadata_refused(self, offsets: list[TopicPartition]) -> ConfigurationError:
        longest = _longest_metadata(offsets)
        return ConfigurationError(
            f"the brokers refused the metadata of the offset commit of {self._source_topic} partitions "
            f"{[tp.partition for tp in offsets]} in consumer group {self._group!r} as too large "
            f"(OFFSET_METADATA_TOO_LARGE), even at {len(longest.encode())} bytes with only the stream times of the "
            f"window and TTL stores ({longest[:200]!r}): raise offset.metadata.max.bytes on every broker, or give "
            "those stores shorter names or fewer per app. Nothing was committed: the next run processes these "
            "messages again."
        )


def _longest_metadata(offsets: list[TopicPartition]) -> str:
    return max((tp.metadata or "" for tp in offsets), key=len)
