"""The App: the engine's façade, and the one module that knows every part of it.

Owns what a user holds: an `AppConfig` (validated settings), the steps (`dataframe()`,
`to_topic()`), listeners, the Kafka connection and the state directory, and the operations users
call: `provisioning_plan()` / `provision()`, `run_worker()` (or `worker()` for one to stop from
another thread), `restore_partitions()` (a partitioned table's: `restore_table_partitions()`),
`describe_partitions()`, `replay_digest()`, `read_state()` and `clear_state()`. Lower layers get
the parts they need, never the App; Kafka errors leave the engine as `KafkaOperationError`s.
"""

from __future__ import annotations

import copy
import logging
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dagster_stateful.core.config import (
    DEFAULT_CACHE_MAX_BYTES,
    AppConfig,
    ErrorPolicy,
    MissingOffsets,
    ProcessingGuarantee,
    Repartition,
    choice,
)
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.connection import KafkaConnection, kafka_clients
from dagster_stateful.core.kafka.error_codes import kafka_errors
from dagster_stateful.core.kafka.provisioning import (
    ProvisioningPlan,
    TopicSpec,
    app_topic_specs,
    provision,
    provisioning_plan,
)
from dagster_stateful.core.monitoring.listeners import Listeners, RestoreListener, StateListener
from dagster_stateful.core.monitoring.report import RestoreReport, WorkerReport
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.interval_joins import JoinedStream
from dagster_stateful.core.processing.dsl.joins import GlobalTable, Table
from dagster_stateful.core.processing.lifecycle import SHUTDOWN_GRACE_SECONDS
from dagster_stateful.core.processing.worker.loop import RunLimits, Worker
from dagster_stateful.core.processing.worker.table_partition import TablePartition
from dagster_stateful.core.queries.app_queries import AppQueries
from dagster_stateful.core.recovery.offline_restore import (
    PartitionRestore,
    RestoreRequest,
    SstWriter,
    restore_partitions,
)
from dagster_stateful.core.recovery.planner import RestoreMethod
from dagster_stateful.core.recovery.table_snapshots import restore_table_partitions, table_snapshots
from dagster_stateful.core.state.commit_metadata import check_metadata_fits
from dagster_stateful.core.state.directory import TABLES_DIR, StateDirectory
from dagster_stateful.core.state.serialization import Serde, resolve_serde
from dagster_stateful.core.state.stores import (
    Duration,
    StoreDeclaration,
    as_ms,
    backends_of,
    store_specs,
    warn_of_stores_in_memory,
)
from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)


class App(AppQueries):
    def __init__(
        self,
        name: str,
        source: str,
        stores: Iterable[StoreDeclaration] = ("default",),
        output: str | None = None,
        state_dir: str | Path = "./state",
        kafka: KafkaConnection | None = None,
        key_serde: Serde | str = "str",
        value_serde: Serde | str = "json",
        output_serde: Serde | str = "json",
        state_serde: Serde | str = "json",
        on_error: ErrorPolicy | str = ErrorPolicy.RAISE,
        commit_interval: float = 5.0,
        commit_every: int = 50_000,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        use_changelog_topics: bool = True,
        changelog_replication_factor: int = -1,
        changelog_config: Mapping[str, str] | None = None,
        auto_create_topics: bool = True,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        group_instance_id: str | None = None,
        restore_batch_size: int = 10_000,
        restore_processes: int | None = None,
        processing_guarantee: ProcessingGuarantee | str = ProcessingGuarantee.AT_LEAST_ONCE,
        missing_offsets: MissingOffsets | str = MissingOffsets.RESUME_FROM_STATE,
        snapshot_root: str | None = None,
        num_standby_replicas: int = 0,
        repartition_purge_interval: float = 30.0,
    ) -> None:
        """
        stores: the state stores, by name, or as `Store(name, ...)` for a store whose entries expire
            (ttl), or held in memory (kind="memory", or "lru" with max_entries), or by a backend of your own.
        kafka: connection settings (librdkafka keys), a bootstrap address, or a `KafkaClients`;
            by default `$KAFKA_BOOTSTRAP_SERVERS`.
        on_error: what to do with a message that cannot be deserialized or whose step raises:
            "raise" (stop; nothing past it is committed), "skip" or "dead-letter" (`<name>-dead-letter`).
        commit_interval / commit_every: commit after this many seconds or messages, whichever first.
        cache_max_bytes: bound of the worker's record caches (the latest value of keys read or
            written lately; Kafka Streams' statestore.cache.max.bytes). Uncommitted writes past it
            make the worker commit early.
        changelog_config: topic configs for the changelogs (min.insync.replicas, segment.bytes,
            segment.ms, min.cleanable.dirty.ratio, max.compaction.lag.ms, ...).
        group_instance_id: static membership: a restarted worker with the same id gets its partitions
            back without a rebalance.
        restore_processes: processes a worker's full restores (no local state) use at once, its own
            included; the others are child processes. By default one per core.
        missing_offsets: when the group has no committed offset for a partition with local state
            (expired or deleted group offsets): "resume-from-state" (from the source offset the local
            state was committed at) or "fail" (stop with the operator's options).
        num_standby_replicas: warm copies of each partition that other workers of the group keep by
            tailing its changelog (Kafka Streams' num.standby.replicas), so a partition that moves to
            one restores a short tail only.
        repartition_purge_interval: seconds between purges of a re-keying app's repartition topic,
            which deletes the records the group has consumed and committed.
        """
        specs = store_specs(stores)
        self._store_specs = {spec.name: spec for spec in specs}
        self.config = AppConfig(
            name=name,
            source=source,
            stores=tuple(spec.name for spec in specs),
            store_ttls={spec.name: spec.ttl_ms for spec in specs if spec.ttl_ms is not None},
            store_backends=backends_of(specs),
            output=output,
            key_serde=resolve_serde(key_serde),
            value_serde=resolve_serde(value_serde),
            output_serde=resolve_serde(output_serde),
            state_serde=resolve_serde(state_serde),
            on_error=choice(ErrorPolicy, on_error, "on_error"),
            commit_interval=commit_interval,
            commit_every=commit_every,
            cache_max_bytes=cache_max_bytes,
            use_changelog_topics=use_changelog_topics,
            changelog_replication_factor=changelog_replication_factor,
            changelog_config=changelog_config or {},
            auto_create_topics=auto_create_topics,
            consumer_config=consumer_config or {},
            producer_config=producer_config or {},
            group_instance_id=group_instance_id,
            restore_batch_size=restore_batch_size,
            restore_processes=restore_processes,
            processing_guarantee=choice(ProcessingGuarantee, processing_guarantee, "processing_guarantee"),
            missing_offsets=choice(MissingOffsets, missing_offsets, "missing_offsets"),
            num_standby_replicas=num_standby_replicas,
            repartition_purge_interval=repartition_purge_interval,
        )
        warn_of_stores_in_memory(specs, use_changelog_topics)
        if not use_changelog_topics:
            log.warning(
                "App %r runs without changelog topics: its local state cannot be recovered if the disk "
                "is lost or a partition moves to another machine",
                name,
            )
        self._state_root = Path(state_dir)
        self.snapshot_root = snapshot_root
        self._kafka = None if kafka is None else kafka_clients(kafka)
        self.listeners = Listeners()
        self._dataframe = StreamingDataFrame(
            list(self.config.stores),
            frozenset(self.config.store_ttls),
            frozenset(spec.name for spec in specs if spec.kind == "lru"),
            on_group_by=self._re_keyed,
        )
        self._global_tables: dict[str, GlobalTable] = {}
        self._tables: dict[str, Table] = {}

    def _re_keyed(self, repartition: Repartition) -> None:
        self.config = self.config.replace(repartition=repartition)

    # What the app is (read from its configuration).

    @property
    def source(self) -> str:
        return self.config.source

    @property
    def output(self) -> str | None:
        return self.config.output

    @property
    def consumer_group(self) -> str:
        return self.config.consumer_group

    @property
    def dead_letter_topic(self) -> str:
        return self.config.dead_letter_topic

    # Where it runs.

    @property
    def kafka(self) -> KafkaClients:
        """The connection: as given, else from $KAFKA_BOOTSTRAP_SERVERS when first needed."""
        if self._kafka is None:
            self._kafka = kafka_clients(None)
        return self._kafka

    @property
    def state_dir(self) -> Path:
        return self._state_root

    @property
    def state(self) -> StateDirectory:
        """The app's local state on this machine."""
        return StateDirectory(self._state_root, self.config)

    @property
    def worker_client_id(self) -> str:
        return self.state.worker_client_id

    def bind(
        self,
        kafka: KafkaConnection | None = None,
        state_dir: str | Path | None = None,
        snapshot_root: str | None = None,
    ) -> App:
        """A copy of this app (same steps and listeners) with another connection or state directory.

        Lets a deployment declare an app once and give it the connection and disk of the place it
        runs (a Dagster resource, a test) later. Listeners added to the copy are the copy's alone.
        """
        bound = copy.copy(self)
        bound.listeners = self.listeners.copy()  # a listener added to the copy stays the copy's
        if kafka is not None:
            bound._kafka = kafka_clients(kafka)
        if state_dir is not None:
            bound._state_root = Path(state_dir)
        if snapshot_root is not None:
            bound.snapshot_root = snapshot_root
        return bound

    def pool_member(self, index: int, pool: str | None = None) -> App:
        """A copy of this app to run as member `index` of a pool of workers on one machine: all share
        the state directory (a partition that moves between members restores only its changelog
        tail), each has its own static membership id `<app>-<pool>-<index>` (`pool`: this host's
        name unless given), so a member that restarts gets its partitions back without a rebalance,
        and under exactly-once its own transactional id. Two members with one id would fence each
        other: run each index once per pool."""
        if index < 0:
            raise ConfigurationError(f"a pool member's index is 0 or more, got {index}")
        member = self.bind()
        member.config = self.config.replace(group_instance_id=f"{self.name}-{pool or socket.gethostname()}-{index}")
        return member

    # Steps and listeners.

    def dataframe(self) -> StreamingDataFrame:
        """The app's steps; add to them with apply / update / filter."""
        return self._dataframe

    def to_topic(self, dataframe: StreamingDataFrame, topic: str | None = None) -> None:
        """Send the values that come out of `dataframe` to the output topic (keyed like the input)."""
        if dataframe is not self._dataframe:
            raise ConfigurationError("to_topic needs the frame returned by this app's dataframe()")
        topic = topic or self.config.output
        if topic is None:
            raise ConfigurationError(f"app {self.name!r} has no output topic; pass output= or a topic")
        self.config = self.config.replace(output=topic, emits_output=True)

    def global_table(
        self, topic: str, name: str | None = None, key_serde: Serde | str = "str", value_serde: Serde | str = "json"
    ) -> GlobalTable:
        """A table every worker of this app keeps whole from the compacted `topic` (Kafka Streams'
        GlobalKTable), for `dataframe().join(table, on=...)`: read up to the topic's end before
        processing starts, kept current while processing, outside the consumer group. `name`
        (the topic's unless given) names its local copy; its keys and values are read with
        `key_serde` and `value_serde`. Suited to small reference data every record may look up."""
        name = name or topic
        if name in self._global_tables:
            raise ConfigurationError(f"app {self.name!r} already has a global table named {name!r}")
        table = GlobalTable(name, topic, resolve_serde(key_serde), resolve_serde(value_serde))
        self.config = self.config.replace(global_tables={**self.config.global_tables, name: topic})
        self._global_tables = {**self._global_tables, name: table}
        return table

    def table(
        self,
        topic: str,
        name: str | None = None,
        key_serde: Serde | str = "str",
        value_serde: Serde | str = "json",
        history: Duration | None = None,
    ) -> Table:
        """A table materialized from the compacted `topic`, partitioned as the records that join it
        (Kafka Streams' KTable from a source topic), for `dataframe().join(table)` on the message
        key: the topic must have as many partitions as the app's task topic (its source, or its
        repartition topic after `group_by`), keyed alike. A worker keeps the table partitions of the
        tasks it holds, under the app's state directory; the topic is the table's changelog (no
        second copy), read back up to the offset committed with the task when the state is lost.
        With `history` (a timedelta or ms), the table is versioned (KIP-889): every version of a key
        is kept that long, and a record joins the value as of its timestamp. Give a versioned
        table's topic a `min.compaction.lag.ms` of at least `history`, or compaction drops versions
        that lookups in the history still need."""
        name = name or topic
        if name in self._tables or name in self._global_tables:
            raise ConfigurationError(f"app {self.name!r} already has a table named {name!r}")
        history_ms = None if history is None else as_ms(history, "table history")
        if history_ms is not None and history_ms <= 0:
            raise ConfigurationError(f"table history must be positive, got {history!r}")
        table = Table(name, topic, resolve_serde(key_serde), resolve_serde(value_serde), history_ms)
        self.config = self.config.replace(tables={**self.config.tables, name: topic})
        self._tables = {**self._tables, name: table}
        return table

    def stream(self, topic: str, name: str | None = None, value_serde: Serde | str = "json") -> JoinedStream:
        """A stream to join with the app's own on the message key (`dataframe().join_interval(stream)`,
        a KStream-KStream join): `topic` is co-partitioned with the app's task topic, keyed alike.
        A worker reads its partition N beside task partition N, in timestamp order."""
        stream = JoinedStream(name or topic, topic, resolve_serde(value_serde))
        self.config = self.config.replace(joined_streams={**self.config.joined_streams, stream.name: topic})
        return stream

    def partitioned_table(self, name: str) -> Table:
        """The partitioned table named `name` (see `table`)."""
        if name not in self._tables:
            raise ConfigurationError(f"app {self.name!r} has no partitioned table {name!r} ({sorted(self._tables)})")
        return self._tables[name]

    def add_restore_listener(self, listener: RestoreListener) -> None:
        self.listeners.restore.append(listener)

    def add_state_listener(self, listener: StateListener) -> None:
        self.listeners.state.append(listener)

    # Operations.

    def topic_specs(self) -> list[TopicSpec]:
        return app_topic_specs(self.config, self._dataframe.changelog_configs())

    def changelog_topic_config(self, store: str) -> dict[str, str]:
        """The topic settings the changelog of `store` is created with (a window store's is also
        deleted past its retention)."""
        topic = self.changelog_topic(store)
        return next(spec.config for spec in self.topic_specs() if spec.name == topic)

    def provisioning_plan(self) -> ProvisioningPlan:
        """Every topic the app needs, compared with the cluster (changes nothing; print `.describe()`)."""
        with kafka_errors(f"inspecting the topics of app {self.name!r}"):
            return provisioning_plan(self.config, self.kafka, self._dataframe.changelog_configs())

    def provision(self, create: bool | None = None) -> ProvisioningPlan:
        """Create missing internal topics (unless `create` is False) and validate the rest."""
        with kafka_errors(f"provisioning the topics of app {self.name!r}"):
            return provision(self.config, self.kafka, create, self._dataframe.changelog_configs())

    def worker(
        self,
        max_messages: int | None = None,
        max_seconds: float | None = None,
        until_caught_up: bool = True,
        partitions: Iterable[int] | None = None,
        grace_seconds: float = SHUTDOWN_GRACE_SECONDS,
    ) -> Worker:
        """One bounded worker, not started: `run()` it; `stop.request()` from another thread ends it.
        With `max_seconds`, it ends within `max_seconds` + `grace_seconds` whatever the brokers do
        (a commit that cannot finish by then raises `CommitTimeoutError`)."""
        check_metadata_fits([*self.config.store_ttls, *self._dataframe.window_stores])
        return Worker(
            config=self.config,
            kafka=self.kafka,
            dataframe=self._dataframe,
            listeners=self.listeners,
            state=self.state,
            limits=RunLimits(max_messages, max_seconds, until_caught_up, grace_seconds),
            snapshot_root=self.snapshot_root,
            partitions=None if partitions is None else list(partitions),
            global_tables=list(self._global_tables.values()),
        )

    def run_worker(
        self,
        max_messages: int | None = None,
        max_seconds: float | None = None,
        until_caught_up: bool = True,
        partitions: Iterable[int] | None = None,
        grace_seconds: float = SHUTDOWN_GRACE_SECONDS,
    ) -> WorkerReport:
        """Run one bounded worker in this process: until caught up, `max_messages` or `max_seconds`,
        whichever comes first, then ending within `grace_seconds` (see `worker`). `partitions` pins
        it to those source partitions (see `Worker`)."""
        worker = self.worker(max_messages, max_seconds, until_caught_up, partitions, grace_seconds)
        with kafka_errors(f"running a worker of app {self.name!r}"):
            return worker.run()

    def restore_partitions(
        self,
        partitions: Iterable[int],
        stores: Iterable[str] | None = None,
        from_scratch: bool = False,
        skip_locked: bool = False,
        snapshot_root: str | None = None,
        method: RestoreMethod | str = RestoreMethod.AUTO,
        spark_cores: int = 0,
        sst_writer: SstWriter | None = None,
        load_processes: int | None = None,
    ) -> list[PartitionRestore]:
        """Bring chosen store partitions up to date outside a worker, by the planner's path (or `method`).

        from_scratch: delete local state first. skip_locked: report partitions a running worker holds
        as skipped instead of failing. snapshot_root: where the snapshots are (default: the app's).
        sst_writer: Spark's SST writer, for the "spark" path.
        load_processes: processes loading partitions at once, from a local snapshot or by replaying
        the whole changelog of partitions with no local state (None: one per core).
        """
        request = RestoreRequest(
            partitions=tuple(partitions),
            stores=None if stores is None else tuple(stores),
            from_scratch=from_scratch,
            skip_locked=skip_locked,
            snapshot_root=snapshot_root or self.snapshot_root,
            method=choice(RestoreMethod, method, "method"),
            spark_cores=spark_cores,
            sst_writer=sst_writer,
            load_processes=load_processes,
        )
        with kafka_errors(f"restoring state of app {self.name!r}"):
            return restore_partitions(self.config, self.kafka, self.state, self.listeners, request)

    def restore_table_partitions(
        self, table: str, partitions: Iterable[int] | None = None, snapshot_root: str | None = None
    ) -> list[RestoreReport]:
        """Load partitions (all, by default) of partitioned `table` on this machine from its latest
        snapshot (refused while a worker holds one): workers then read the table's topic on from the
        snapshot's end only (`recovery.table_snapshots`)."""
        declared = self.partitioned_table(table)
        snapshots = table_snapshots(snapshot_root or self.snapshot_root, self.name, table, declared.versioned)
        directory, lock_seconds = self.app_dir() / TABLES_DIR / table, self.state.lock_timeout_seconds
        with kafka_errors(f"restoring table {table!r} of app {self.name!r}"):
            copies = lambda p: TablePartition(declared, p, directory / str(p))  # noqa: E731 - one use
            return restore_table_partitions(copies, snapshots, self.kafka, partitions, lock_seconds)

    def clear_state(self, partitions: Iterable[int] | None = None, stores: Iterable[str] | None = None) -> list[Path]:
        """Delete local state (all, or some stores / partitions). Refused while a worker of the app runs here."""
        return self.state.clear(stores, partitions)

    def app_dir(self) -> Path:
        return self.state.app_dir
