"""An app's configuration: what it reads, keeps and writes, and how it commits, as one frozen value.

Owns `AppConfig` and the enums of its choices (`ErrorPolicy`, `ProcessingGuarantee`). Every layer
below the `App` façade takes an `AppConfig`, never the `App`: it names the consumer group and the
internal topics (`<name>-<store>-changelog`, `<name>-dead-letter`), holds the resolved serializers,
the error policy, the commit and changelog settings and the Kafka client settings, and validates
them once, raising `ConfigurationError` with what to change.

An app reads one or more topics (`input_topics`): the source, and, when its steps re-key the
records (`Repartition`), the internal repartition topic `<name>-<group>-repartition`, which the app
writes and reads back. Global tables (`global_tables`, name -> topic) are read whole by every
worker, outside the consumer group. Partitioned tables (`tables`, name -> topic) are co-partitioned
with the topic whose records join them (`table_stream_topic`: the task topic, or the source for a
table joined before the re-keying): a worker keeps table partition N beside that topic's partition
N. The stores belong
to the partitions of one topic, the `task_topic`: state partition N is that topic's partition N
(the repartition topic when there is one).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from dagster_stateful.core.state.backend import BackendFactory
from dagster_stateful.core.state.commit_metadata import check_metadata_fits
from dagster_stateful.core.state.serialization import Serde, resolve_serde
from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)


class ErrorPolicy(StrEnum):
    """What a worker does with a message it cannot deserialize or whose step raises."""

    RAISE = "raise"
    SKIP = "skip"
    DEAD_LETTER = "dead-letter"


class ProcessingGuarantee(StrEnum):
    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""Exactly-once: the producer's `transaction.timeout.ms` unless `producer_config` sets it. The broker
aborts a transaction left open longer (a crashed worker's), which until then holds back
`read_committed` readers of its partitions; a commit interval must be well below it."""


DEFAULT_CACHE_MAX_BYTES = 64 * 1024 * 1024
"""Bytes a worker's record caches may hold unless the app sets `cache_max_bytes`."""


class MissingOffsets(StrEnum):
    """What a worker does when the group has no committed offset for a partition that has local state
    (bounded workers leave the group empty between runs, so `offsets.retention.minutes` can expire
    its offsets, or an operator deleted them)."""

    RESUME_FROM_STATE = "resume-from-state"
    """Resume from the source offset the local state was committed at (exact: state and offset match)."""
    FAIL = "fail"
    """Stop with the operator's options."""


@dataclass(frozen=True)
class Repartition:
    """The app re-keys its records (`StreamingDataFrame.group_by`): the steps before it run on the
    source's records and send them, under their new key, to the repartition topic, whose partitions
    own the state of the steps after it (Kafka Streams' repartition topic after `groupBy`)."""

    name: str
    """The re-keying's name: the repartition topic is `<app>-<name>-repartition`."""
    partitions: int | None = None
    """The repartition topic's partition count (None: the source's)."""
    joined_before: tuple[str, ...] = ()
    """The tables joined before the re-keying: the partitioned ones join on the source's key,
    co-partitioned with the source, not with the repartition topic; global ones feed the repartition
    topic, not the stores."""

    def __post_init__(self) -> None:
        _check_name(self.name, what="group_by name")
        if self.partitions is not None and self.partitions <= 0:
            raise ConfigurationError(f"group_by {self.name!r} needs a positive partition count, got {self.partitions}")


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """One app's settings. Build it through `App(...)`, or directly for the engine's lower layers.

    Serializer names ("str", "json", ...) and policy strings are resolved on construction.
    """

    name: str
    """The consumer group, and the prefix of the app's internal topics."""
    source: str
    stores: tuple[str, ...] = ("default",)
    store_ttls: Mapping[str, int] = field(default_factory=dict)
    """The time-to-live (ms of stream time) of the stores whose entries expire (`stores.Store.ttl`)."""
    store_backends: Mapping[str, BackendFactory] = field(default_factory=dict)
    """What holds the stores not kept in RocksDB (`stores.Store.kind` and `backend`)."""
    output: str | None = None
    emits_output: bool = False
    """True once `App.to_topic` routed the steps' results to `output`."""
    key_serde: Serde = field(default_factory=lambda: resolve_serde("str"))
    value_serde: Serde = field(default_factory=lambda: resolve_serde("json"))
    output_serde: Serde = field(default_factory=lambda: resolve_serde("json"))
    state_serde: Serde = field(default_factory=lambda: resolve_serde("json"))
    on_error: ErrorPolicy = ErrorPolicy.RAISE
    commit_interval: float = 5.0
    commit_every: int = 50_000
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    """Bound of the worker's record caches, all store partitions together (Kafka Streams'
    `statestore.cache.max.bytes`): the latest value of the keys read or written lately, counted as
    key, value and 200 bytes of overhead per entry. Past it the worker evicts clean entries (oldest
    first), and commits early when uncommitted writes alone exceed it. 0 keeps no
    read cache and commits after every consumed batch that wrote state."""
    use_changelog_topics: bool = True
    changelog_replication_factor: int = -1
    changelog_config: Mapping[str, str] = field(default_factory=dict)
    auto_create_topics: bool = True
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    group_instance_id: str | None = None
    restore_batch_size: int = 10_000
    restore_processes: int | None = None
    """Processes a worker's full restores use at once, its own included (None: one per core)."""
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.AT_LEAST_ONCE
    missing_offsets: MissingOffsets = MissingOffsets.RESUME_FROM_STATE
    num_standby_replicas: int = 0
    """Standby copies of each partition that the group's other members keep (`processing.standbys`)."""
    repartition: Repartition | None = None
    """Set when the steps re-key the records through a repartition topic."""
    global_tables: Mapping[str, str] = field(default_factory=dict)
    """The global tables the steps join with: table name -> its compacted topic (read whole by every worker)."""
    tables: Mapping[str, str] = field(default_factory=dict)
    """The partitioned tables the steps join with: table name -> its compacted topic, co-partitioned
    with `table_stream_topic(name)` (a worker keeps the partitions of that topic's partitions it holds)."""
    joined_streams: Mapping[str, str] = field(default_factory=dict)
    """The streams an interval join reads beside the task topic: stream name -> its topic,
    co-partitioned with `task_topic` (a worker reads the partitions of those it holds)."""
    repartition_purge_interval: float = 30.0
    """Seconds between purges of the repartition topic's consumed and committed records (Kafka
    Streams' `repartition.purge.interval.ms`)."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        stores = tuple(self.stores)
        if not stores or len(set(stores)) != len(stores):
            raise ConfigurationError(f"app {self.name!r} needs distinct store names, got {list(stores)}")
        for store in stores:
            _check_name(store, what="store name")
        self._set("stores", stores)
        self._check_ttls(stores)
        for serde_field in ("key_serde", "value_serde", "output_serde", "state_serde"):
            self._set(serde_field, resolve_serde(getattr(self, serde_field)))
        self._set("on_error", choice(ErrorPolicy, self.on_error, "on_error"))
        guarantee = choice(ProcessingGuarantee, self.processing_guarantee, "processing_guarantee")
        self._set("processing_guarantee", guarantee)
        self._set("missing_offsets", choice(MissingOffsets, self.missing_offsets, "missing_offsets"))
        if self.commit_interval <= 0 or self.commit_every <= 0:
            raise ConfigurationError("commit_interval and commit_every must be positive")
        if self.cache_max_bytes < 0:
            raise ConfigurationError(f"cache_max_bytes must be 0 or more, got {self.cache_max_bytes}")
        self._set("global_tables", dict(self.global_tables))
        for table in self.global_tables:
            _check_name(table, what="global table name")
        self._set("tables", dict(self.tables))
        for table in self.tables:
            _check_name(table, what="table name")
        self._set("joined_streams", dict(self.joined_streams))
        for stream in self.joined_streams:
            _check_name(stream, what="joined stream name")
        if self.repartition_purge_interval < 0:
            raise ConfigurationError("repartition_purge_interval must be 0 or more")
        if self.restore_batch_size <= 0:
            raise ConfigurationError("restore_batch_size must be positive")
        if self.restore_processes is not None and self.restore_processes <= 0:
            raise ConfigurationError(
                f"restore_processes must be positive (or None: one per core), got {self.restore_processes}"
            )
        self._check_standbys()
        self._set("changelog_config", {"cleanup.policy": "compact", **self.changelog_config})
        self._set("consumer_config", dict(self.consumer_config))
        self._set("producer_config", dict(self.producer_config))
        if self.exactly_once:
            self._check_transactions()

    def _check_standbys(self) -> None:
        if self.num_standby_replicas < 0:
            raise ConfigurationError(f"num_standby_replicas is 0 or more, got {self.num_standby_replicas}")
        if self.num_standby_replicas and not self.use_changelog_topics:
            raise ConfigurationError(
                f"app {self.name!r} keeps standby replicas, which read the changelogs: it needs use_changelog_topics"
            )

    def _check_ttls(self, stores: tuple[str, ...]) -> None:
        ttls = dict(self.store_ttls)
        unknown = sorted((set(ttls) | set(self.store_backends)) - set(stores))
        if unknown:
            raise ConfigurationError(f"app {self.name!r} sets options of stores {unknown} it does not declare")
        self._set("store_backends", dict(self.store_backends))
        for store, ttl in ttls.items():
            if ttl <= 0:
                raise ConfigurationError(f"the ttl of store {store!r} must be positive, got {ttl} ms")
        check_metadata_fits(ttls)  # their stream times ride in each commit's metadata
        self._set("store_ttls", ttls)
        if ttls and "delete" in str(self.changelog_config.get("cleanup.policy", "")):
            retention = int(self.changelog_config.get("retention.ms", 7 * 24 * 3600 * 1000))
            short = sorted(store for store, ttl in ttls.items() if 0 <= retention < ttl)
            if short:
                raise ConfigurationError(
                    f"changelog_config deletes changelog records after retention.ms={retention}, less than the ttl of "
                    f"stores {short}: a restore would lose entries that have not expired. Expired entries are "
                    "tombstoned in the changelog, so compaction alone keeps it small: drop 'delete' from "
                    "cleanup.policy, or keep retention.ms at least the largest ttl."
                )

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE

    @property
    def transaction_timeout_ms(self) -> int:
        return int(self.producer_config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))

    def _check_transactions(self) -> None:
        if "transactional.id" in self.producer_config:
            raise ConfigurationError(
                "producer_config must not set transactional.id: under exactly-once each worker derives its own "
                "(from group_instance_id, or its host and state directory), so that a restarted worker fences its "
                "zombie"
            )
        delivery = self.producer_config.get("delivery.timeout.ms", self.producer_config.get("message.timeout.ms"))
        if delivery is not None and int(delivery) > self.transaction_timeout_ms:
            raise ConfigurationError(
                f"producer_config sets delivery.timeout.ms {delivery}, above transaction.timeout.ms "
                f"{self.transaction_timeout_ms}: under exactly-once a record may not wait longer than its transaction "
                "may stay open; lower it or raise transaction.timeout.ms"
            )
        if self.commit_interval * 1000 * 2 > self.transaction_timeout_ms:
            raise ConfigurationError(
                f"commit_interval {self.commit_interval:g} s is too long for transaction.timeout.ms "
                f"{self.transaction_timeout_ms} ms: a transaction stays open for a commit interval, so keep the "
                "interval at most half the timeout (lower commit_interval or raise transaction.timeout.ms in "
                "producer_config, up to the broker's transaction.max.timeout.ms)"
            )

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> AppConfig:
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def consumer_group(self) -> str:
        return self.name

    @property
    def restore_group(self) -> str:
        """The group id of the consumers that replay changelogs (assigned, never joined nor committed:
        librdkafka needs one, and the broker checks Describe on it)."""
        return f"{self.name}-restore"

    @property
    def verify_group(self) -> str:
        """The group id of the consumer that replays a changelog to verify a store (as `restore_group`)."""
        return f"{self.name}-verify"

    def changelog_topic(self, store: str) -> str:
        return f"{self.name}-{store}-changelog"

    def changelog_topics(self) -> dict[str, str] | None:
        """Changelog topic per store; None when the app runs without changelogs."""
        if not self.use_changelog_topics:
            return None
        return {store: self.changelog_topic(store) for store in self.stores}

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.name}-dead-letter"

    @property
    def repartition_topic(self) -> str | None:
        """The internal topic the re-keyed records go through (None: the app does not re-key)."""
        return None if self.repartition is None else f"{self.name}-{self.repartition.name}-repartition"

    @property
    def task_topic(self) -> str:
        """The topic whose partitions own the stores: state partition N is its partition N."""
        return self.repartition_topic or self.source

    def joined_before_rekeying(self, table: str) -> bool:
        """Whether table `table` (partitioned or global) is joined before `group_by`."""
        return self.repartition is not None and table in self.repartition.joined_before

    def table_stream_topic(self, table: str) -> str:
        """The topic whose records join partitioned table `table`, partition for partition: the
        source for a table joined before `group_by`, else the task's topic."""
        if self.joined_before_rekeying(table):
            return self.source
        return self.task_topic

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every topic the worker consumes, the source first."""
        return (self.source,) if self.repartition_topic is None else (self.source, self.repartition_topic)


def _check_name(name: str, what: str = "app name") -> None:
    if not name or any(not (c.isalnum() or c in "._-") for c in name):
        raise ConfigurationError(
            f"{what} {name!r} must be non-empty and use only letters, digits, '.', '_', '-' "
            "(it names the consumer group and the internal topics)"
        )


_E = TypeVar("_E", bound=StrEnum)


def choice(enum: type[_E], value: str, setting: str) -> _E:
    """`value` as a member of `enum`, or a `ConfigurationError` naming the setting and the choices."""
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in enum)
        raise ConfigurationError(f"{setting}={value!r} is not one of {allowed}") from None
