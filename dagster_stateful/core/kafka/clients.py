"""The Kafka adapter: the only module of the core that talks to confluent-kafka directly.

Owns client construction from one set of connection settings (bootstrap servers, security; the
caller passes secrets in, this module never logs settings) and the administrative reads and
writes the engine needs: topic layouts (partitions, replication) and configs, topic creation,
low/high watermarks, a consumer group's committed offsets and members. Every admin call waits out
transient failures (brokers down or unreachable, partitions without a leader yet, coordinators
loading) with capped exponential backoff for up to `admin_timeout_seconds`, so a worker survives a
broker restart; past that it raises a retriable `KafkaOperationError`. A bounded worker's clients
(`until`) also give up at the worker's deadline. What waiting does not cure is raised at once:
every client reports authentication and TLS failures to the connection's `SecurityWatch` (its
`error_cb`), which an admin call checks after each failed attempt (the first attempts are short, so
that this takes seconds: librdkafka's calls only time out meanwhile), and a refused ACL becomes a
`KafkaAuthorizationError` naming the access the call needed. librdkafka's own log lines go through
Python logging (`ClientLog`), not raw to stderr; retried admin calls are `retrying.AdminRetries`.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
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

from dagster_stateful.core.kafka.descriptions import GroupDescription, GroupMember, TopicLayout
from dagster_stateful.core.kafka.error_codes import (
    as_operation_error,
    kafka_error_of,
)
from dagster_stateful.core.kafka.retrying import ATTEMPT_TIMEOUT as ATTEMPT_TIMEOUT  # re-exported
from dagster_stateful.core.kafka.retrying import BACKOFF_FIRST, MIN_ATTEMPT_TIMEOUT, AdminRetries
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.authorization import is_authorization_failure
from dagster_stateful.core.kafka.security.failures import ClientIdentity, SecurityWatch
from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)


ADMIN_TIMEOUT = 30.0
"""Default of `KafkaClients(admin_timeout_seconds=...)`: how long an admin call waits out transient failures."""
DEFAULT_REPLICATION = -1
"""`replication_factor` meaning the brokers' `default.replication.factor` (CreateTopics v4+)."""
FETCH_QUEUE_BACKOFF_MS = 20
"""How long librdkafka waits before fetching again for a partition whose prefetched queue is past
its thresholds (`fetch.queue.backoff.ms`, 1 s by default). A consumer that empties its queue
faster than that sits idle for the rest of the second: a columnar worker empties 100,000 queued
messages in a few tenths of a second (bench/bench_fetch_size.py), and a restore reading one
changelog partition ran at 111k records/s with the default, 620k with 20 ms
(bench/bench_restore_memory.py)."""
NEW_TOPIC_FIRST_PAUSE = 0.02
"""The first pause while a topic created a moment ago does not answer yet: on a healthy cluster its
partitions serve requests within tens of milliseconds (then the pauses double, as for any call)."""
RESTORE_CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    # Changelogs of exactly-once apps hold aborted transactions; at-least-once ones none at all.
    "isolation.level": "read_committed",
    # Restores read to a known end: never wait on an idle partition, and fetch again as soon as the
    # restore has taken what was fetched. With that backoff, 1 MiB partition fetches (librdkafka's
    # default) restored as fast as 8 MiB ones and cost 30 MiB less at the peak
    # (bench/bench_restore_memory.py).
    "fetch.wait.max.ms": 10,
    "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    "max.partition.fetch.bytes": 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
}
SIDE_READER_CONFIG = {**RESTORE_CONSUMER_CONFIG, "enable.partition.eof": True}
"""A worker's reader of topics beside its task partitions (tables, a joined stream, a foreign-key
join's right table): assigned, outside the group, told when it reaches a partition's end."""
REBOOTSTRAP_AFTER_MS = 10_000
"""How long a client may go without metadata from any broker before it bootstraps again (librdkafka's
`metadata.recovery.rebootstrap.trigger.ms`, 5 min by default). Measured with librdkafka 2.16 while a
broker shut down: a client can be left knowing no broker at all (its log says "Group coordinator
decommissioned", then shows no connection attempt), and it connects to none until the trigger has
passed: a worker's consumer stayed outside its group, and a synchronous commit blocked, for minutes
after the broker was back. A setting of the connection overrides it."""
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset
_MISSING_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
_T = TypeVar("_T")


class ClientLog:
    """Where librdkafka's own log lines go (given to every client as its `logger`): the Python
    logger `dagster_stateful.core.kafka.librdkafka`, at most at WARNING, since what librdkafka
    reports as an error (a refused connection, a broker gone) is retried by the client, and the
    engine raises what it cannot get past with its own error."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, message: str, *args: object) -> None:
        self.logger.log(min(level, logging.WARNING), message, *args)


CLIENT_LOG = ClientLog(logging.getLogger(f"{__name__.rsplit('.', 1)[0]}.librdkafka"))


def describe_replication(replication_factor: int) -> str:
    """A replication factor as an operator reads it: -1 is the brokers' default."""
    return "default" if replication_factor == DEFAULT_REPLICATION else str(replication_factor)


class KafkaClients:
    """Makes producers, consumers and admin calls from one set of connection settings.

    admin_timeout_seconds: how long each admin call (metadata, offsets, topic creation, group reads)
    keeps retrying transient failures, such as brokers being down, before it raises a retriable
    `KafkaOperationError`. Raise it to let workers wait out longer broker outages.
    """

    def __init__(self, settings: Mapping[str, Any], admin_timeout_seconds: float = ADMIN_TIMEOUT) -> None:
        if "bootstrap.servers" not in settings:
            raise ConfigurationError("Kafka settings need 'bootstrap.servers' (the brokers to connect to)")
        if not admin_timeout_seconds > 0:
            raise ConfigurationError(f"admin_timeout_seconds must be positive, got {admin_timeout_seconds!r}")
        self.settings = dict(settings)
        self.admin_timeout_seconds = float(admin_timeout_seconds)
        self.deadline: float | None = None
        """A `time.monotonic()` moment past which admin calls give up (see `until`); None: none."""
        self.security = SecurityWatch(ClientIdentity.of(self.settings))
        """The authentication or TLS failure any client of these settings met (shared with `until`'s copies)."""
        self._admin: AdminClient | None = None

    def until(self, deadline: float | None) -> KafkaClients:
        """These clients (the same admin client), with admin calls that also give up at `deadline`
        (a `time.monotonic()` moment; None: only after `admin_timeout_seconds`)."""
        self.admin()
        bounded = copy.copy(self)
        bounded.deadline = deadline
        return bounded

    @property
    def bootstrap_servers(self) -> str:
        return str(self.settings["bootstrap.servers"])

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._client_config())
        return self._admin

    def producer(self, config: Mapping[str, Any] | None = None) -> Producer:
        return Producer(self._client_config(config))

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer(self._client_config(config))

    def check_security(self, doing: str) -> None:
        """Raise the authentication or TLS failure a client reported (`KafkaAuthenticationError`,
        `KafkaTlsError`), as the error of `doing`; nothing when there was none."""
        self.security.check(doing)

    def _client_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The settings of one client: these clients' over its own, with the log and the watch as
        callbacks (an `error_cb` of the settings is called after the watch's)."""
        merged: dict[str, Any] = {
            "logger": CLIENT_LOG,
            "metadata.recovery.rebootstrap.trigger.ms": REBOOTSTRAP_AFTER_MS,
            **self.settings,
            **(config or {}),
        }
        merged["error_cb"] = self.security.error_callback(merged.get("error_cb"))
        return merged

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count, or None when it does not exist."""
        layout = self.topic_layout(topic)
        return None if layout is None else layout.partitions

    def topic_layout(self, topic: str) -> TopicLayout | None:
        """The topic's partition count and replication factor, or None when it does not exist."""

        def call(timeout: float) -> TopicLayout | None:
            metadata = self.admin().list_topics(topic, timeout=timeout).topics.get(topic)
            if metadata is None or (metadata.error is not None and metadata.error.code() in _MISSING_TOPIC):
                return None
            if metadata.error is not None:
                raise KafkaException(metadata.error)
            replicas = min((len(p.replicas) for p in metadata.partitions.values()), default=0)
            return TopicLayout(len(metadata.partitions), replicas)

        return self._retrying(
            call,
            f"reading the metadata of topic {topic}",
            needs=[AclRequirement(ResourceType.TOPIC, topic, Operation.DESCRIBE)],
        )

    def topic_config(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

        def call(timeout: float) -> dict[str, Any]:
            future = self.admin().describe_configs([resource], request_timeout=timeout)[resource]
            return future.result(timeout=timeout + MIN_ATTEMPT_TIMEOUT)

        entries = self._retrying(
            call,
            f"reading the configuration of topic {topic}",
            final=_MISSING_TOPIC,
            needs=[AclRequirement(ResourceType.TOPIC, topic, Operation.DESCRIBE_CONFIGS)],
        )
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def create_topic(self, name: str, partitions: int, replication_factor: int, config: Mapping[str, str]) -> None:
        """Create the topic (an existing one is left as it is) and return once every partition answers.

        replication_factor: -1 (`DEFAULT_REPLICATION`) leaves it to the brokers' default.replication.factor.
        """
        replication = describe_replication(replication_factor)
        topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))

        def call(timeout: float) -> None:
            future = self.admin().create_topics([topic], operation_timeout=timeout, request_timeout=timeout)[name]
            try:
                future.result(timeout=timeout + MIN_ATTEMPT_TIMEOUT)
            except KafkaException as error:
                kafka_error = kafka_error_of(error)
                if kafka_error is None or kafka_error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

        self._retrying(
            call,
            f"creating topic {name} ({partitions} partitions, replication {replication}, {dict(config)})",
            needs=[AclRequirement(ResourceType.TOPIC, name, Operation.CREATE)],
        )
        # Creation returns before the new partitions serve requests (metadata may already name a
        # leader that answers NOT_LEADER / UNKNOWN_TOPIC_OR_PART): wait until every one answers.
        waiting = f"waiting for new topic {name} to answer"
        self._offsets(name, list(range(partitions)), (OffsetSpec.latest(),), waiting, first_pause=NEW_TOPIC_FIRST_PAUSE)
        log.info("Created topic %s (%d partitions, replication %s, %s)", name, partitions, replication, dict(config))

    def watermarks(self, topic: str, partitions: Iterable[int], committed: bool = False) -> dict[int, tuple[int, int]]:
        """(low, high) offsets per partition. committed: high is the last stable offset, the end a
        `read_committed` reader sees (below any open transaction; the high watermark without one)."""
        partitions = list(partitions)
        if not partitions:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        low, high = self._offsets(
            topic, partitions, (OffsetSpec.earliest(), OffsetSpec.latest()), f"listing offsets of {topic}", isolation
        )
        return {p: (low[p], high[p]) for p in partitions}

    def ends(self, topic: str, partitions: Iterable[int], timeout: float) -> dict[int, int]:
        """Where each partition ends now (its high watermark), in one ListOffsets attempt of at most
        `timeout` seconds through the admin client, whose connections carry no long-polling fetch
        (a consumer's query waits behind its own fetch, `fetch.wait.max.ms`). Raises
        `KafkaException`, or `TimeoutError` when the broker does not answer in time."""
        return self._list_offsets_once(
            topic, list(partitions), OffsetSpec.latest(), timeout, IsolationLevel.READ_UNCOMMITTED
        )

    def _offsets(
        self,
        topic: str,
        partitions: list[int],
        specs: tuple[OffsetSpec, ...],
        doing: str,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
        first_pause: float = BACKOFF_FIRST,
    ) -> list[dict[int, int]]:
        """Offsets per partition for each of `specs` (earliest, latest, ...), read in one retried attempt."""

        def call(timeout: float) -> list[dict[int, int]]:
            return [self._list_offsets_once(topic, partitions, spec, timeout, isolation) for spec in specs]

        what = f"{doing} partitions {partitions}"
        return self._retrying(
            call,
            what,
            topic=topic,
            needs=[AclRequirement(ResourceType.TOPIC, topic, Operation.DESCRIBE)],
            first_pause=first_pause,
        )

    def _list_offsets_once(
        self, topic: str, partitions: list[int], spec: OffsetSpec, timeout: float, isolation: IsolationLevel
    ) -> dict[int, int]:
        futures = self.admin().list_offsets(
            {TopicPartition(topic, p): spec for p in partitions}, isolation_level=isolation, request_timeout=timeout
        )
        offsets = {
            tp.partition: future.result(timeout=timeout + MIN_ATTEMPT_TIMEOUT).offset for tp, future in futures.items()
        }
        unanswered = sorted(p for p, offset in offsets.items() if offset < 0)
        if unanswered:
            # librdkafka answers a partition whose leader's broker died, until a new leader is
            # elected, with offset -1001 (OFFSET_INVALID) and no error.
            raise KafkaException(
                KafkaError(
                    KafkaError.LEADER_NOT_AVAILABLE,
                    f"no offset for {topic} partitions {unanswered}: their leader did not answer",
                    retriable=True,
                )
            )
        return offsets

    def committed_offsets(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset per partition (None where it never committed)."""
        return {partition: offset for partition, (offset, _) in self.committed(group, topic, partitions).items()}

    def committed(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int | None, str | None]]:
        """The group's committed offset (None where it never committed) and its metadata per partition.

        Read through a consumer that never joins the group: the admin ListConsumerGroupOffsets
        call can crash librdkafka 2.x when the coordinator is still loading (librdkafka#5040).
        """
        partitions = list(partitions)
        if not partitions:
            return {}
        reader = self.consumer({"group.id": group, "enable.auto.commit": False})
        what = f"reading group {group!r}'s committed offsets on {topic}"
        needs = [
            AclRequirement(ResourceType.GROUP, group, Operation.DESCRIBE),
            AclRequirement(ResourceType.TOPIC, topic, Operation.DESCRIBE),
        ]
        try:
            result = self._retrying(
                lambda timeout: reader.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout),
                what,
                needs=needs,
                consumer=reader,
            )
        finally:
            reader.close()
        for tp in result:
            if tp.error is not None and is_authorization_failure(tp.error):
                raise as_operation_error(KafkaException(tp.error), what, needs, self.security.identity.principal)
        return {tp.partition: (None if tp.offset < 0 else tp.offset, tp.metadata) for tp in result}

    def describe_group(self, group: str, topic: str) -> GroupDescription:
        """The group's state and members, with the partitions of `topic` each one owns."""
        description = self._retrying(
            lambda timeout: (
                self.admin()
                .describe_consumer_groups([group], request_timeout=timeout)[group]
                .result(timeout=timeout + MIN_ATTEMPT_TIMEOUT)
            ),
            f"describing consumer group {group!r}",
            needs=[AclRequirement(ResourceType.GROUP, group, Operation.DESCRIBE)],
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

    def time_left(self, seconds: float, at_least: float = -math.inf) -> float:
        """`seconds`, or the time left before the deadline when that is shorter (<= 0 once it
        passed), but not less than `at_least`."""
        left = seconds if self.deadline is None else min(seconds, self.deadline - time.monotonic())
        return max(at_least, left)

    def _seconds_allowed(self) -> float:
        """How long the next admin call may retry: the admin timeout, or the time left before the deadline."""
        return self.time_left(self.admin_timeout_seconds)

    def _retrying(
        self,
        call: Callable[[float], _T],
        what: str,
        final: Collection[int] = (),
        topic: str | None = None,
        needs: Sequence[AclRequirement] = (),
        consumer: Consumer | None = None,
        first_pause: float = BACKOFF_FIRST,
    ) -> _T:
        """`call(attempt timeout)`, retried as `retrying.AdminRetries` says."""
        retries = AdminRetries(self.admin, self.security, self.bootstrap_servers, self._seconds_allowed())
        return retries.run(call, what, final, topic, needs, consumer, first_pause)
