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


class RecoveryError(StatefulError):
    """Local state, changelog and source offsets disagree in a way that needs an operator's choice."""


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
