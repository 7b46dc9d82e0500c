"""The App's queries of its state from outside a run: descriptions, reads, key lookups, digests.

Owns `AppQueries`, the part of the `App` façade that answers questions about state without running
a worker: `describe_partitions()`, `describe_tables()`, `describe_inputs()`, `replay_digest()`,
`store_profile()`, `read_state()`, `read_key()`, `key_location()`, `store_shape()` and
`row_decoder()`. The `App` inherits it and provides the configuration, the Kafka clients, the state
directory and the declared steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.error_codes import kafka_errors
from dagster_stateful.core.kafka.partitioner import Partitioner
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.queries.describe import PartitionDescription, describe_partitions
from dagster_stateful.core.queries.input_lag import InputsLag, describe_inputs
from dagster_stateful.core.queries.key_location import KeyLocation, locate_key
from dagster_stateful.core.queries.key_reads import KeyRead, read_key
from dagster_stateful.core.queries.tables import TablePartitionDescription, describe_tables
from dagster_stateful.core.recovery.verification import Digest, replay_digest
from dagster_stateful.core.state.decoding import RowDecoder, StoreShape
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.interval_join_state import IntervalJoinBounds
from dagster_stateful.core.state.query import StoreReader
from dagster_stateful.core.state.session_state import SessionBounds
from dagster_stateful.core.state.sliding_state import SlidingBounds
from dagster_stateful.core.state.stores import Store
from dagster_stateful.core.state.table_join_state import TableJoinBounds
from dagster_stateful.core.state.window_state import WindowBounds
from dagster_stateful.errors import ConfigurationError


class AppQueries(ABC):
    """Queries of an app's state; the `App` supplies what they read."""

    config: AppConfig
    _store_specs: Mapping[str, Store]
    _dataframe: StreamingDataFrame

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def stores(self) -> list[str]:
        return list(self.config.stores)

    @property
    @abstractmethod
    def kafka(self) -> KafkaClients: ...

    @property
    @abstractmethod
    def state(self) -> StateDirectory: ...

    def changelog_topic(self, store: str) -> str:
        return self.config.changelog_topic(store)

    def describe_partitions(
        self, partitions: Iterable[int] | None = None, stores: Iterable[str] | None = None
    ) -> list[PartitionDescription]:
        """Offsets, lag, keys and bytes of each store partition, without running a worker."""
        with kafka_errors(f"describing the state of app {self.name!r}"):
            return describe_partitions(self.config, self.kafka, self.state, partitions, stores)

    def describe_tables(self, partitions: Iterable[int] | None = None) -> list[TablePartitionDescription]:
        """Per partitioned table and partition: the position the group's last commit applied it to,
        the table's end, and the records not applied yet."""
        with kafka_errors(f"describing the tables of app {self.name!r}"):
            return describe_tables(self.config, self.kafka, self.state, partitions)

    def describe_inputs(self) -> InputsLag:
        """The work waiting on every input: messages left on the source (and the repartition topic),
        the partitioned tables' records not applied, and the global tables' sizes."""
        with kafka_errors(f"reading the lag of app {self.name!r} on its inputs"):
            return describe_inputs(self.config, self.kafka, self.state)

    def replay_digest(self, store: str, partition: int) -> Digest:
        """Digest of a store partition rebuilt from its changelog alone, in a scratch directory."""
        with kafka_errors(f"replaying {self.changelog_topic(store)}[{partition}]"):
            return replay_digest(self.config, self.kafka, store, partition)

    def store_profile(self, store: str) -> dict[str, str | int]:
        """What `store` is, for people: its kind (rocksdb, memory, lru or custom), what it holds
        (key-value state, aggregates, windows or sessions), and its ttl, bound, or windows' size (or
        sessions' gap), grace and retention (ms) where it has them."""
        spec = self._store_specs[store]
        profile: dict[str, str | int] = {"kind": "custom" if spec.backend is not None else spec.kind}
        live = self._dataframe.live_stores
        bounds = live.get(store)
        profile["holds"] = (
            "key-value state"
            if store not in live
            else "aggregates"
            if bounds is None
            else "sessions"
            if isinstance(bounds, SessionBounds)
            else "sliding windows"
            if isinstance(bounds, SlidingBounds)
            else "interval join records"
            if isinstance(bounds, IntervalJoinBounds)
            else "table join rows"
            if isinstance(bounds, TableJoinBounds)
            else "windows"
        )
        if spec.ttl_ms is not None:
            profile["ttl_ms"] = spec.ttl_ms
        if spec.max_entries is not None:
            profile["max_entries"] = spec.max_entries
        if isinstance(bounds, SessionBounds):
            profile["session_gap_ms"] = bounds.gap
        elif bounds is not None:
            profile["window_size_ms"] = bounds.size
        if bounds is not None:
            profile["window_grace_ms"] = bounds.grace
            profile["window_retention_ms"] = bounds.retention
        return profile

    def read_state(self, store: str, partitions: Iterable[int] | None = None) -> StoreReader:
        """A reader of `store`'s local partitions (all, or `partitions`) that takes no lock, so it reads
        a running worker's state as well as a stopped one's: `get(message_key, state_key)`,
        `items(...)`, or a window store's `windows(...)`. Close it when done (it is a context manager)."""
        return self._reader(self.state, self._readable_shape(store), partitions)

    def _readable_shape(self, store: str) -> StoreShape:
        if store in self.config.store_backends:
            raise ConfigurationError(
                f"store {store!r} is not kept in RocksDB (an in-memory store lives only inside its worker), so it "
                "cannot be read from outside: read its changelog topic, or keep it in RocksDB to query it"
            )
        return self.store_shape(store)

    def _reader(self, directory: StateDirectory, shape: StoreShape, partitions: Iterable[int] | None) -> StoreReader:
        return StoreReader(directory, shape, self.config.key_serde, self.config.state_serde, partitions)

    def read_key(self, store: str, key: Any, partitioner: Partitioner = "murmur2") -> KeyRead:
        """`key`'s state in `store`, from the freshest copy of its partition on this machine: the
        active owner's, a standby's (while the active copy restores, or once its owner is gone) or
        this app's own; the answer says which copy it came from and how far behind that copy is."""
        shape = self._readable_shape(store)
        location = self.key_location(store, key, partitioner)
        return read_key(
            self.config, self.kafka, self.state.root, location, lambda d, parts: self._reader(d, shape, parts)
        )

    def key_location(self, store: str, key: Any, partitioner: Partitioner = "murmur2") -> KeyLocation:
        """Where `key`'s state lives now: its partition under the producers' `partitioner`, the member
        owning it (static id, client id, host) and those keeping its standbys (Kafka Streams' queryMetadataForKey)."""
        return locate_key(self.config, self.kafka, store, key, partitioner)

    def store_shape(self, store: str) -> StoreShape:
        """What decoding `store`'s rows needs beyond the serializers: its TTL or its windows."""
        if store not in self.config.stores:
            raise ConfigurationError(f"unknown store {store!r}; app {self.name!r} declares {self.stores}")
        bounds = self._dataframe.live_stores.get(store)
        sessions = isinstance(bounds, SessionBounds)
        return StoreShape(
            store,
            self.config.store_ttls.get(store),
            bounds.size if isinstance(bounds, WindowBounds) else None,
            None if bounds is None else bounds.retention,
            sessions=sessions,
        )

    def row_decoder(self, store: str) -> RowDecoder:
        """Decodes `store`'s stored rows (from RocksDB or a snapshot) with this app's serializers."""
        return RowDecoder(self.store_shape(store), self.config.key_serde, self.config.state_serde)
