"""What an app declares about each of its state stores beyond its name.

Owns `Store`: a store's name and its time-to-live (`ttl`): entries of a store with a TTL expire
that long, in stream time, after their last `set`. An app lists its stores by name, or as a `Store`
where it needs more than the defaults; `store_specs` turns that list into one `Store` per name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from dagster_stateful.errors import ConfigurationError

__all__ = ["Duration", "Store", "StoreDeclaration", "as_ms", "store_specs"]


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
    """A state store: `Store("seen", ttl=timedelta(hours=1))`.

    ttl: how long an entry lives after its last `state.set`, in stream time (the largest message
    timestamp its partition has seen, as for windows): once stream time passes it, the entry reads
    as missing, and the next commit deletes it locally and tombstones it in the changelog. None
    (the default): entries live until deleted.
    """

    name: str
    ttl: Duration | None = None

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
            specs.append(store)
        else:
            raise ConfigurationError(f"a store is declared by its name or as a Store(...), got {store!r}")
    return tuple(specs)
