"""The App: one stateful application, its configuration and its public entry points.

Owns what an app is (name = consumer group and prefix of its internal topics; one source topic;
named stores; steps; optional output topic), the names of its internal topics, the topic specs its
provisioning plan checks, and the operations users call: `dataframe()`, `to_topic()`,
`provisioning_plan()` / `provision()`, `run_worker()` and `clear_state()`.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import socket
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from dagster_stateful.core.dataframe import StreamingDataFrame
from dagster_stateful.core.kafka import KafkaClients
from dagster_stateful.core.listeners import Listeners, RestoreListener, StateListener
from dagster_stateful.core.locking import AppActivityLock
from dagster_stateful.core.provisioning import ProvisioningPlan, TopicRole, TopicSpec, apply, inspect
from dagster_stateful.core.report import WorkerReport
from dagster_stateful.core.serialization import Serde, resolve_serde
from dagster_stateful.errors import ConfigurationError, StateLockedError

log = logging.getLogger(__name__)

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


class ErrorPolicy(str, Enum):
    RAISE = "raise"
    SKIP = "skip"
    DEAD_LETTER = "dead-letter"


class App:
    def __init__(
        self,
        name: str,
        source: str,
        stores: Iterable[str] = ("default",),
        output: str | None = None,
        state_dir: str | Path = "./state",
        kafka: KafkaClients | Mapping[str, Any] | str | None = None,
        key_serde: Serde | str = "str",
        value_serde: Serde | str = "json",
        output_serde: Serde | str = "json",
        state_serde: Serde | str = "json",
        on_error: ErrorPolicy | str = ErrorPolicy.RAISE,
        commit_interval: float = 5.0,
        commit_every: int = 50_000,
        use_changelog_topics: bool = True,
        changelog_replication_factor: int = 1,
        changelog_config: Mapping[str, str] | None = None,
        auto_create_topics: bool = True,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        group_instance_id: str | None = None,
        restore_batch_size: int = 10_000,
        processing_guarantee: str = "at-least-once",
    ) -> None:
        """
        kafka: connection settings (librdkafka keys), a bootstrap address, or a `KafkaClients`;
            by default `$KAFKA_BOOTSTRAP_SERVERS`.
        on_error: what to do with a message that cannot be deserialized or whose step raises:
            "raise" (stop; nothing past it is committed), "skip" or "dead-letter" (`<name>-dead-letter`).
        commit_interval / commit_every: commit after this many seconds or messages, whichever first.
        changelog_config: topic configs for the changelogs (min.insync.replicas, segment.bytes,
            segment.ms, min.cleanable.dirty.ratio, max.compaction.lag.ms, ...).
        group_instance_id: static membership: a restarted worker with the same id gets its partitions
            back without a rebalance.
        """
        self.name = _check_name(name)
        self.source = source
        self.stores = list(stores)
        if not self.stores or len(set(self.stores)) != len(self.stores):
            raise ConfigurationError(f"app {name!r} needs distinct store names, got {self.stores}")
        self.output = output
        self.state_dir = Path(state_dir)
        self._kafka = None if kafka is None else _kafka_clients(kafka)
        self.key_serde = resolve_serde(key_serde)
        self.value_serde = resolve_serde(value_serde)
        self.output_serde = resolve_serde(output_serde)
        self.state_serde = resolve_serde(state_serde)
        self.on_error = ErrorPolicy(on_error)
        if commit_interval <= 0 or commit_every <= 0:
            raise ConfigurationError("commit_interval and commit_every must be positive")
        self.commit_interval = commit_interval
        self.commit_every = commit_every
        self.use_changelog_topics = use_changelog_topics
        if not use_changelog_topics:
            log.warning("App %r runs without changelog topics: its local state cannot be recovered if the disk "
                        "is lost or a partition moves to another machine", name)
        self.changelog_replication_factor = changelog_replication_factor
        self.changelog_config = {"cleanup.policy": "compact", **(changelog_config or {})}
        self.auto_create_topics = auto_create_topics
        self.consumer_config = dict(consumer_config or {})
        self.producer_config = dict(producer_config or {})
        self.group_instance_id = group_instance_id
        self.restore_batch_size = restore_batch_size
        if processing_guarantee != "at-least-once":
            raise ConfigurationError(f"processing_guarantee {processing_guarantee!r} is not supported yet; "
                                     "use 'at-least-once'")
        self.processing_guarantee = processing_guarantee
        self.listeners = Listeners()
        self._dataframe = StreamingDataFrame(self.stores)
        self.emits_output = False

    @property
    def kafka(self) -> KafkaClients:
        """The connection: as given, else from $KAFKA_BOOTSTRAP_SERVERS when first needed."""
        if self._kafka is None:
            self._kafka = _kafka_clients(None)
        return self._kafka

    def bind(self, kafka: KafkaClients | Mapping[str, Any] | str | None = None,
             state_dir: str | Path | None = None) -> App:
        """A copy of this app (same steps and listeners) with another connection or state directory.

        Lets a deployment declare an app once and give it the connection and disk of the place it
        runs (a Dagster resource, a test) later.
        """
        bound = copy.copy(self)
        if kafka is not None:
            bound._kafka = _kafka_clients(kafka)
        if state_dir is not None:
            bound.state_dir = Path(state_dir)
        return bound

    @property
    def consumer_group(self) -> str:
        return self.name

    @property
    def worker_client_id(self) -> str:
        """The Kafka client.id of this app's workers here: says which host and state directory own a
        partition, so a sensor can tell its own machine's copies from others'."""
        return f"{self.name}@{socket.gethostname()}:{self.state_dir.resolve()}"

    def changelog_topic(self, store: str) -> str:
        return f"{self.name}-{store}-changelog"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.name}-dead-letter"

    def dataframe(self) -> StreamingDataFrame:
        """The app's steps; add to them with apply / update / filter."""
        return self._dataframe

    def to_topic(self, dataframe: StreamingDataFrame, topic: str | None = None) -> None:
        """Send the values that come out of `dataframe` to the output topic (keyed like the input)."""
        if dataframe is not self._dataframe:
            raise ConfigurationError("to_topic needs the frame returned by this app's dataframe()")
        topic = topic or self.output
        if topic is None:
            raise ConfigurationError(f"app {self.name!r} has no output topic; pass output= or a topic")
        self.output = topic
        self.emits_output = True

    def add_restore_listener(self, listener: RestoreListener) -> None:
        self.listeners.restore.append(listener)

    def add_state_listener(self, listener: StateListener) -> None:
        self.listeners.state.append(listener)

    def topic_specs(self) -> list[TopicSpec]:
        specs = [TopicSpec(self.source, TopicRole.SOURCE, None)]
        if self.use_changelog_topics:
            specs += [TopicSpec(self.changelog_topic(store), TopicRole.CHANGELOG, None,
                                self.changelog_replication_factor, dict(self.changelog_config))
                      for store in self.stores]
        if self.emits_output and self.output:
            specs.append(TopicSpec(self.output, TopicRole.OUTPUT, None, self.changelog_replication_factor))
        if self.on_error is ErrorPolicy.DEAD_LETTER:
            specs.append(TopicSpec(self.dead_letter_topic, TopicRole.DEAD_LETTER, None,
                                   self.changelog_replication_factor))
        return specs

    def provisioning_plan(self) -> ProvisioningPlan:
        """Every topic the app needs, compared with the cluster (changes nothing; print `.describe()`)."""
        return inspect(self.topic_specs(), self.kafka)

    def provision(self, create: bool | None = None) -> ProvisioningPlan:
        """Create missing internal topics (unless `create` is False) and validate the rest."""
        return apply(self.provisioning_plan(), self.kafka, self.auto_create_topics if create is None else create)

    def run_worker(self, max_messages: int | None = None, max_seconds: float | None = None,
                   until_caught_up: bool = True, partitions: Iterable[int] | None = None) -> WorkerReport:
        """Run one bounded worker in this process: until caught up, `max_messages` or `max_seconds`,
        whichever comes first. `partitions` pins it to those source partitions (see `Worker`)."""
        from dagster_stateful.core.worker import RunLimits, Worker

        chosen = None if partitions is None else list(partitions)
        return Worker(self, RunLimits(max_messages, max_seconds, until_caught_up), chosen).run()

    def app_dir(self) -> Path:
        return self.state_dir / self.name

    def activity_lock(self) -> AppActivityLock:
        return AppActivityLock(self.app_dir() / ".app.lock")

    def clear_state(self, partitions: Iterable[int] | None = None, stores: Iterable[str] | None = None) -> list[Path]:
        """Delete local state (all, or some stores / partitions). Refused while a worker of the app runs here."""
        lock = self.activity_lock()
        if not lock.try_exclusive():
            raise StateLockedError(f"a worker of app {self.name!r} is running on {self.app_dir()}; stop it before "
                                   "clearing its state")
        try:
            return _delete_state(self.app_dir(), list(stores or self.stores), partitions)
        finally:
            lock.release()


def _delete_state(app_dir: Path, stores: list[str], partitions: Iterable[int] | None) -> list[Path]:
    deleted = []
    for store in stores:
        store_dir = app_dir / store
        targets = [store_dir] if partitions is None else [store_dir / str(p) for p in partitions]
        for target in targets:
            if target.exists():
                shutil.rmtree(target)
                deleted.append(target)
                log.info("Deleted local state %s", target)
    return deleted


def _check_name(name: str) -> str:
    if not name or any(not (c.isalnum() or c in "._-") for c in name):
        raise ConfigurationError(f"app name {name!r} must be non-empty and use only letters, digits, '.', '_', '-' "
                                 "(it names the consumer group and the internal topics)")
    return name


def _kafka_clients(kafka: KafkaClients | Mapping[str, Any] | str | None) -> KafkaClients:
    if isinstance(kafka, KafkaClients):
        return kafka
    if isinstance(kafka, str):
        return KafkaClients({"bootstrap.servers": kafka})
    if kafka is not None:
        return KafkaClients(kafka)
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise ConfigurationError(f"no Kafka connection: pass kafka= to App or set {BOOTSTRAP_ENV}")
    return KafkaClients({"bootstrap.servers": bootstrap})
