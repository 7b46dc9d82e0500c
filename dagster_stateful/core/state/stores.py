"""What an app declares about each of its state stores beyond its name.

Owns `Store`: a store's name, its time-to-live (`ttl`: entries expire that long, in stream time,
after their last `set`) and what holds it: RocksDB on disk (the default), a dict in memory
(`kind="memory"`), a dict of at most `max_entries` keys per partition evicting the least recently
used (`kind="lru"`), or a backend of the user's own (`backend=`, a `backend.BackendFactory`). An app
lists its stores by name, or as a `Store` where it needs more than the defaults; `store_specs`
turns that list into one `Store` per name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from dagster_stateful.core.state.backend import BackendFactory
from dagster_stateful.core.state.memory import lru_backend, memory_backend
from dagster_stateful.errors import ConfigurationError

__all__ = [
    "STORE_KINDS",
    "Duration",
    "Store",
    "StoreDeclaration",
    "as_ms",
    "backends_of",
    "store_specs",
    "warn_of_stores_in_memory",
]

log = logging.getLogger(__name__)

STORE_KINDS = ("rocksdb", "memory", "lru")


Duration = timedelta | int
"""A duration: a timedelta, or an int of milliseconds."""


def as_ms(duration: Duration, what: str) -> int:
    """`duration` in whole milliseconds (a ConfigurationError naming `what` when it is not one)."""
    if isinstance(duration, timedelta):
        ms = duration / timedelta(milliseconds=1)
        if ms != int(ms):
            raise ConfigurationError(f"{what} must be whole milliseconds, got {duration}")
        return int(ms)
    if isinstance(duration, bool) or not isinstance(duration, int):
        raise ConfigurationError(f"{what} is a timedelta or an int of milliseconds, got {duration!r}")
    return duration


@dataclass(frozen=True)
class Store:
    """A state store: `Store("seen", ttl=timedelta(hours=1))`, `Store("recent", kind="lru", max_entries=10_000)`.

    ttl: how long an entry lives after its last `state.set`, in stream time (the largest message
    timestamp its partition has seen, as for windows): once stream time passes it, the entry reads
    as missing, and the next commit deletes it locally and tombstones it in the changelog. None
    (the default): entries live until deleted.
    kind: "rocksdb" (on disk, the default), "memory" (a dict: fast, but restored in full from the
    changelog on every assignment) or "lru" (a dict of at most `max_entries` keys per partition;
    the least recently used go, each with a tombstone in the changelog).
    backend: a `backend.BackendFactory` of your own, instead of a kind.
    """

    name: str
    ttl: Duration | None = None
    kind: str = "rocksdb"
    max_entries: int | None = None
    backend: BackendFactory | None = None

    def backend_factory(self) -> BackendFactory | None:
        """What holds the store's partitions; None for RocksDB (the engine's default)."""
        if self.kind not in STORE_KINDS:
            raise ConfigurationError(f"store {self.name!r} has kind={self.kind!r}; the kinds are {list(STORE_KINDS)}")
        if (self.max_entries is not None) != (self.kind == "lru"):
            raise ConfigurationError(
                f"store {self.name!r}: max_entries bounds an LRU store, and an LRU store needs it: declare "
                f'Store({self.name!r}, kind="lru", max_entries=...) or drop max_entries'
            )
        if self.kind == "lru" and self.ttl is not None:
            raise ConfigurationError(
                f"store {self.name!r} cannot both expire (ttl) and evict (lru): choose one, or keep them in two stores"
            )
        if self.backend is not None:
            if self.kind != "rocksdb":
                raise ConfigurationError(f"store {self.name!r} gives both kind={self.kind!r} and a backend: give one")
            return self.backend
        if self.kind == "memory":
            return memory_backend()
        if self.kind == "lru":
            assert self.max_entries is not None
            return lru_backend(self.max_entries)
        return None

    @property
    def ttl_ms(self) -> int | None:
        if self.ttl is None:
            return None
        ttl = as_ms(self.ttl, f"the ttl of store {self.name!r}")
        if ttl <= 0:
            raise ConfigurationError(f"the ttl of store {self.name!r} must be positive, got {self.ttl!r}")
        return ttl


StoreDeclaration = str | Store
"""How an app names a store: its name, or a `Store` with its options."""


def store_specs(declared: Iterable[StoreDeclaration]) -> tuple[Store, ...]:
    """One `Store` per declaration, in order (a name becomes a `Store` with the defaults)."""
    specs = []
    for store in declared:
        if isinstance(store, str):
            specs.append(Store(store))
        elif isinstance(store, Store):
            store.ttl_ms  # noqa: B018 - validates the ttl now, with the store's name
            store.backend_factory()
            specs.append(store)
        else:
            raise ConfigurationError(f"a store is declared by its name or as a Store(...), got {store!r}")
    return tuple(specs)


def backends_of(specs: Iterable[Store]) -> dict[str, BackendFactory]:
    """The backend of each store not kept in RocksDB, by name."""
    backends = {}
    for spec in specs:
        factory = spec.backend_factory()
        if factory is not None:
            backends[spec.name] = factory
    return backends


def warn_of_stores_in_memory(specs: Iterable[Store], use_changelog_topics: bool) -> None:
    for spec in specs:
        if spec.kind in ("memory", "lru"):
            log.warning(
                "Store %r is held in memory: every assignment of one of its partitions (each worker run, each "
                "rebalance) restores it in full from its changelog%s",
                spec.name,
                ""
                if use_changelog_topics
                else ", and without changelog topics its state is lost whenever a worker stops",
            )
