"""The one error hierarchy of dagster-stateful.

Every error the project raises on purpose derives from `StatefulError`. Messages say what
happened, where (topic, partition, offset, path) and what the operator can do about it. This
module imports nothing from dagster or pyspark so the core engine can use it.
"""

from __future__ import annotations


class StatefulError(Exception):
    """Base class of every dagster-stateful error."""


class LocalKafkaError(StatefulError):
    """The local development broker, or the jars it needs, could not be provided."""


class JavaNotFoundError(LocalKafkaError):
    """No suitable Java runtime (17+) was found."""


class PortInUseError(LocalKafkaError):
    """A port the local broker was asked to listen on is taken."""


class BrokerStartError(LocalKafkaError):
    """The broker process exited or did not answer in time."""


class RegistryStartError(LocalKafkaError):
    """The development Schema Registry's process exited or did not answer in time."""


class LocalSparkError(StatefulError):
    """The local Spark standalone cluster could not be started or reached."""


class ConfigurationError(StatefulError):
    """An app, store or job was configured in a way that cannot work."""


class TopicMismatchError(StatefulError):
    """A topic exists but differs from what the app needs (partitions, cleanup policy)."""


class TopicMissingError(StatefulError):
    """A topic the app needs does not exist and is not the app's to create."""


class KafkaOperationError(StatefulError):
    """A Kafka call failed in a way the engine does not handle itself; keeps Kafka's error code.

    `code` is librdkafka's numeric error code (`confluent_kafka.KafkaError.<NAME>`), `code_name`
    its name, and `retriable` whether Kafka says trying again may succeed.
    """

    def __init__(
        self, message: str, code: int | None = None, code_name: str | None = None, retriable: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.retriable = retriable


class KafkaSecurityError(KafkaOperationError):
    """Kafka refused this client: its credentials, its TLS setup or its rights (ACLs) do not let it do
    what the engine asked. Never retriable: the same settings fail the same way, so the engine raises
    it at once instead of waiting it out as an outage.

    A `KafkaOperationError` (Kafka's error code is kept), not a `ConfigurationError`: whether the
    client's settings or the cluster's users, certificates or ACLs must change, only the operator can
    tell. `broker` is the address of the broker that refused (None where unknown). The message names
    what failed and what to change; it never holds a password.
    """

    def __init__(
        self, message: str, code: int | None = None, code_name: str | None = None, broker: str | None = None
    ) -> None:
        super().__init__(message, code=code, code_name=code_name, retriable=False)
        self.broker = broker


class KafkaAuthenticationError(KafkaSecurityError):
    """The brokers did not accept the client's SASL credentials: a wrong password, an unknown user
    (Kafka reports both as invalid credentials) or a mechanism the brokers do not enable.
    `user` and `mechanism` are the client's (None where not set)."""

    def __init__(
        self,
        message: str,
        code: int | None = None,
        code_name: str | None = None,
        broker: str | None = None,
        user: str | None = None,
        mechanism: str | None = None,
    ) -> None:
        super().__init__(message, code, code_name, broker)
        self.user = user
        self.mechanism = mechanism


class KafkaTlsError(KafkaSecurityError):
    """The TLS handshake with a broker failed: its certificate is not trusted (`ssl.ca.location`), is
    not valid for the name the client connected to, or the broker refused the client's certificate."""


class KafkaAuthorizationError(KafkaSecurityError):
    """The client authenticated, but an ACL it needs is missing. `operation` (Kafka's ACL operation
    as kafka-acls names it, e.g. Read), `resource_type` (topic, group, transactional-id, cluster) and
    `resource_name` say which, where the engine knows them (None otherwise)."""

    def __init__(
        self,
        message: str,
        code: int | None = None,
        code_name: str | None = None,
        operation: str | None = None,
        resource_type: str | None = None,
        resource_name: str | None = None,
    ) -> None:
        super().__init__(message, code, code_name)
        self.operation = operation
        self.resource_type = resource_type
        self.resource_name = resource_name


class DeliveryError(StatefulError):
    """Kafka did not acknowledge records the commit depends on; nothing was committed."""


class ProducerFencedError(DeliveryError):
    """Exactly-once: another producer with this worker's transactional id started; this one is a
    zombie and must stop without committing."""


class CommitTimeoutError(DeliveryError):
    """A commit could not finish in the time the run had: Kafka did not answer before a bounded
    worker's deadline (`max_seconds` plus its shutdown grace), or within the commit's own timeout.

    `committed` is, per source partition the commit was for, the offset committed before it (None:
    never committed); `uncommitted` the offset it tried to commit. The messages in between were
    processed but not committed: the next run processes them again (unless Kafka completes the
    commit after the worker gave up, in which case the next run restores the stores from their
    changelogs). Nothing is lost either way.
    """

    def __init__(
        self,
        message: str,
        committed: dict[int, int | None] | None = None,
        uncommitted: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.committed = dict(committed or {})
        self.uncommitted = dict(uncommitted or {})


class StateLockedError(StatefulError):
    """A state partition (or the app's state) is held by another worker or process."""


class StateStoreError(StatefulError):
    """A local state store cannot be opened or written."""


class StoreCorruptedError(StateStoreError):
    """RocksDB reported corruption (or an I/O failure) in a state partition; names where.

    `path` is the partition's directory; `store` and `partition` say which store partition it is
    (None where the database was opened without them). Never a step failure: the partition must be
    moved aside and restored from its changelog (`StorePartition.quarantine`).
    """

    def __init__(self, message: str, path: str, store: str | None = None, partition: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.store = store
        self.partition = partition


class StateSerializationError(StatefulError):
    """A step set a state value the store's serializer cannot encode.

    Raised by `State.set`, inside the step, so the app's error policy applies to the message that
    set it; the value never reaches the commit.
    """


class StateTableError(StatefulError):
    """A table given as a store's state (a bootstrap or a migration) does not fit the store, or the
    store cannot take it now; names the row, key or topic and what to do. Nothing was written."""


class RecoveryError(StatefulError):
    """Local state, changelog and source offsets disagree in a way that needs an operator's choice."""


class MetadataVersionError(RecoveryError):
    """A commit's metadata was written by a release whose changelog format this one cannot read."""


class ProcessingError(StatefulError):
    """A message could not be processed under the `raise` error policy; names topic, partition, offset."""

    def __init__(self, message: str, topic: str, partition: int, offset: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset


class LateMessage(StatefulError):
    """A message arrived after every window it belongs to had closed: what a dead-lettered late
    message's headers describe (never raised: late messages are counted, not failures)."""
