"""What the state views a step gets have in common: one store partition, scoped to the current key.

Owns `KeyView`, the base of `kv.State` (key-value state) and `live.LiveState` (the
aggregations' state): the store partition, its record cache, the state serializer's decoding, the
current message's key prefix and source offset, which the partition transaction binds before each
message (`_bind`), and the partition's metrics, in which the views count their operations (see
`monitoring.store_metrics`). Also `timed_variant`: a view's class with its operations timed, which
a view takes for a burst of messages (see `transaction.PartitionTransaction`), so that the other
messages pay nothing for the timing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any, TypeVar

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde, fast_loads

__all__ = ["KeyView", "timed_variant"]


class KeyView:
    """One store partition's state, seen through its record cache, for the current message key."""

    __slots__ = ("_cache", "_loads", "_metrics", "_offset", "_partition", "_prefix", "_serde", "_values")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde) -> None:
        self._partition = partition
        self._cache = cache
        self._values = cache.values
        self._metrics = partition.metrics
        self._serde = serde
        self._loads = fast_loads(serde)
        self._prefix = b""
        self._offset = -1

    def _bind(self, prefix: bytes, offset: int) -> None:
        self._prefix = prefix
        self._offset = offset

    def _decode(self, data: bytes) -> Any:
        """`data` deserialized; what the serde refuses is raised by its own `loads`, described."""
        try:
            return self._loads(data)
        except Exception:  # noqa: BLE001 - the serde's own loads raises it, described
            return self._serde.loads(data)


_View = TypeVar("_View", bound=KeyView)


def timed_variant(view: type[_View], operations: Mapping[str, str]) -> type[_View]:
    """`view` with each method named in `operations` timed into the latency of its operation (e.g.
    {"set": "put"}), and a `_bind` that counts down the partition metrics' `timed_messages_left` and
    gives the object back its class `view` once the burst is over. A timed call includes the
    wrapper's own call, about 0.2 µs."""
    namespace: dict[str, Any] = {"__slots__": (), "_bind": _rebinding(view)}
    for name, operation in operations.items():
        namespace[name] = _timed(getattr(view, name), operation)
    return type(f"Timed{view.__name__}", (view,), namespace)


def _timed(method: Callable[..., Any], operation: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(self: KeyView, *args: Any, **kwargs: Any) -> Any:
        started = perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._metrics.latency[operation].record(perf_counter() - started)

    return timed


def _rebinding(view: type[KeyView]) -> Callable[[KeyView, bytes, int], None]:
    def _bind(self: KeyView, prefix: bytes, offset: int) -> None:
        metrics = self._metrics
        metrics.timed_messages_left -= 1
        if metrics.timed_messages_left < 0:
            self.__class__ = view
        view._bind(self, prefix, offset)

    return _bind
