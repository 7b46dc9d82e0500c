"""The Kafka adapter: the only module of the core that talks to confluent-kafka directly.

Owns client construction from one set of connection settings (bootstrap servers, security; the
caller passes secrets in, this module never logs settings) and the administrative reads and
writes the engine needs: topic partition counts and configs, topic creation, low/high watermarks
and a consumer group's committed offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from dagster_stateful.core.kafka.errors import as_operation_error, kafka_errors
from dagster_stateful.errors import ConfigurationError, KafkaOperationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None
    partitions: tuple[int, ...]
    """Partitions of the topic asked about that this member owns."""


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    """Kafka's group state: STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, EMPTY, DEAD, UNKNOWN."""
    members: tuple[GroupMember, ...]

    def owners(self) -> dict[int, str]:
        """Partition -> a stable name of the member that owns it (instance id, else client@host)."""
        return {
            p: member.group_instance_id or f"{member.client_id}@{member.host}/{member.member_id[-8:]}"
            for member in self.members
            for p in member.partitions
        }


ADMIN_TIMEOUT = 30.0
ATTEMPT_TIMEOUT = 10.0
"""One try of an admin call that may be retried within ADMIN_TIMEOUT."""
RESTORE_CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_uncommitted",
    # Restores read to a known end: never wait on an idle partition, and fetch big chunks
    # (measured here: 16 MiB partition fetches double the records/s of the 1 MiB default).
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
}
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset


class KafkaClients:
    """Makes producers, consumers and admin calls from one set of connection settings."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        if "bootstrap.servers" not in settings:
            raise ConfigurationError("Kafka settings need 'bootstrap.servers' (the brokers to connect to)")
        self.settings = dict(settings)
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        return str(self.settings["bootstrap.servers"])

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.settings)
        return self._admin

    def producer(self, config: Mapping[str, Any] | None = None) -> Producer:
        return Producer({**self.settings, **(config or {})})

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer({**self.settings, **config})

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count, or None when it does not exist."""
        with kafka_errors(f"reading the metadata of topic {topic}"):
            metadata = self.admin().list_topics(topic, timeout=ADMIN_TIMEOUT).topics.get(topic)
        if metadata is None or (
            metadata.error is not None
            and metadata.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        ):
            return None
        if metadata.error is not None:
            raise as_operation_error(KafkaException(metadata.error), f"reading the metadata of topic {topic}")
        return len(metadata.partitions)

    def topic_config(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        with kafka_errors(f"reading the configuration of topic {topic}"):
            entries = self.admin().describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT)
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def create_topic(self, name: str, partitions: int, replication_factor: int, config: Mapping[str, str]) -> None:
        topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))
        with kafka_errors(f"creating topic {name} ({partitions} partitions, {dict(config)})"):
            future = self.admin().create_topics([topic], operation_timeout=ADMIN_TIMEOUT)[name]
            try:
                future.result(timeout=ADMIN_TIMEOUT)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            self._wait_for_leaders(name, partitions)
        log.info(
            "Created topic %s (%d partitions, replication %d, %s)", name, partitions, replication_factor, dict(config)
        )

    def _wait_for_leaders(self, topic: str, partitions: int) -> None:
        """Creation returns before every broker knows the new partitions' leaders; wait for them."""
        deadline = time.monotonic() + ADMIN_TIMEOUT
        while time.monotonic() < deadline:
            metadata = self.admin().list_topics(topic, timeout=ADMIN_TIMEOUT).topics.get(topic)
            if (
                metadata is not None
                and metadata.error is None
                and len(metadata.partitions) == partitions
                and all(p.leader >= 0 for p in metadata.partitions.values())
            ):
                return
            time.sleep(0.1)
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"topic {topic} has no leaders after {ADMIN_TIMEOUT:.0f} s")
        )

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """(low, high) offsets per partition."""
        partitions = list(partitions)
        if not partitions:
            return {}
        low = self._list_offsets(topic, partitions, OffsetSpec.earliest())
        high = self._list_offsets(topic, partitions, OffsetSpec.latest())
        return {p: (low[p], high[p]) for p in partitions}

    def _list_offsets(self, topic: str, partitions: list[int], spec: OffsetSpec) -> dict[int, int]:
        def call() -> dict[int, int]:
            futures = self.admin().list_offsets(
                {TopicPartition(topic, p): spec for p in partitions}, request_timeout=ADMIN_TIMEOUT
            )
            return {tp.partition: future.result(timeout=ADMIN_TIMEOUT).offset for tp, future in futures.items()}

        return _retrying(call, f"listing offsets of {topic} partitions {partitions}")

    def committed_offsets(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset per partition (None where it never committed).

        Read through a consumer that never joins the group: the admin ListConsumerGroupOffsets
        call can crash librdkafka 2.x when the coordinator is still loading (librdkafka#5040).
        """
        partitions = list(partitions)
        if not partitions:
            return {}
        reader = self.consumer({"group.id": group, "enable.auto.commit": False})
        try:
            result = _retrying(
                lambda: reader.committed([TopicPartition(topic, p) for p in partitions], timeout=ADMIN_TIMEOUT),
                f"reading group {group!r}'s committed offsets on {topic}",
            )
        finally:
            reader.close()
        return {tp.partition: (None if tp.offset < 0 else tp.offset) for tp in result}

    def describe_group(self, group: str, topic: str) -> GroupDescription:
        """The group's state and members, with the partitions of `topic` each one owns."""
        description = _retrying(
            lambda: (
                self.admin()
                .describe_consumer_groups([group], request_timeout=ATTEMPT_TIMEOUT)[group]
                .result(timeout=ATTEMPT_TIMEOUT + 5)
            ),
            f"describing consumer group {group!r}",
        )
        members = tuple(
            GroupMember(
                member.member_id,
                member.client_id,
                member.host,
                member.group_instance_id,
                tuple(sorted(tp.partition for tp in (member.assignment.topic_partitions or []) if tp.topic == topic)),
            )
            for member in description.members
        )
        state = getattr(description.state, "name", str(description.state))
        return GroupDescription(group, state, members)


_T = TypeVar("_T")
_TRANSIENT = {
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _retrying(call: Callable[[], _T], what: str) -> _T:
    """Run an admin call, retrying transient errors (a coordinator still loading, a new partition
    whose leader is not elected yet, a request left unanswered) for up to ADMIN_TIMEOUT; what is
    left is raised as a `KafkaOperationError` about `what`."""
    deadline = time.monotonic() + ADMIN_TIMEOUT
    while True:
        try:
            return call()
        except FutureTimeoutError as error:
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"Kafka did not answer within {ADMIN_TIMEOUT:.0f} s while {what}; check that the brokers are "
                    "reachable and run again.",
                    code=KafkaError._TIMED_OUT,
                    code_name="_TIMED_OUT",
                    retriable=True,
                ) from error
            log.debug("Retrying a Kafka admin call that got no answer in time")
        except KafkaException as error:
            kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
            retriable = kafka_error is not None and (kafka_error.retriable() or kafka_error.code() in _TRANSIENT)
            if not retriable or time.monotonic() > deadline:
                raise as_operation_error(error, what) from error
            log.debug("Retrying a Kafka admin call after %s", error)
            time.sleep(0.2)
