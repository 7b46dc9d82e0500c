"""The uncommitted work of one partition between two commits.

Owns `PartitionTransaction`: per store, a record cache (`cache.StoreCache`) holding the last value
written to each key since the last commit (repeated writes to a key cost one changelog record and
one RocksDB put) and the values read or committed lately, and the view each step gets of it
(`kv.State`, `ttl.TtlState`, `live.LiveState` or `window_state.WindowState`). The writes of the message
being processed are journaled and undone if it fails, so a step that fails half-way leaves no
trace. Before a commit, expiring stores delete what has expired and bounded stores what the commit
would push out (`prepare_commit`). When the transaction starts and after each commit, its views
take their `view.timed_variant` for a burst of messages (see `metrics.SAMPLE_EVERY`). Work kept
outside the stores that must commit with the partition (the partition's tables, which record
their positions in the commit's metadata) joins the transaction as a `participant.Participant`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat

from dagster_stateful.core.state import kv, live
from dagster_stateful.core.state.cache import Change, StoreCache
from dagster_stateful.core.state.foreign_key_join_state import ForeignKeyJoinBounds, ForeignKeyJoinState
from dagster_stateful.core.state.interval_join_state import IntervalJoinBounds, IntervalJoinState
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.live import LiveState
from dagster_stateful.core.state.metrics import SAMPLE_EVERY, TIMED_BURST
from dagster_stateful.core.state.participant import Participant
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import LiveSerializer, Serde
from dagster_stateful.core.state.session_state import SessionBounds, SessionState
from dagster_stateful.core.state.sliding_state import SlidingBounds, SlidingState
from dagster_stateful.core.state.table_join_state import TableJoinBounds, TableJoinState
from dagster_stateful.core.state.timers import TimerQueue
from dagster_stateful.core.state.ttl import TtlState
from dagster_stateful.core.state.view import KeyView, timed_variant
from dagster_stateful.core.state.window_state import WindowBounds, WindowState
from dagster_stateful.errors import StateStoreError

__all__ = ["Change", "PartitionTransaction"]

_TIMED: dict[type[KeyView], type[KeyView]] = {
    State: timed_variant(State, kv.TIMED_OPERATIONS),
    LiveState: timed_variant(LiveState, live.TIMED_OPERATIONS),
    TtlState: timed_variant(TtlState, kv.TIMED_OPERATIONS),
    WindowState: timed_variant(WindowState, live.TIMED_OPERATIONS),
    SessionState: timed_variant(SessionState, live.TIMED_OPERATIONS),
    SlidingState: timed_variant(SlidingState, live.TIMED_OPERATIONS),
    IntervalJoinState: timed_variant(IntervalJoinState, live.TIMED_OPERATIONS),
    TableJoinState: timed_variant(TableJoinState, live.TIMED_OPERATIONS),
    ForeignKeyJoinState: timed_variant(ForeignKeyJoinState, live.TIMED_OPERATIONS),
}
"""The views a sampled message's operations are timed in, by class."""


def _window_view(
    partition: StorePartition, cache: StoreCache, serde: Serde, bounds: WindowBounds | SessionBounds
) -> WindowState:
    """The view of a store of time windows, sliding windows, sessions, or a join's records."""
    if isinstance(bounds, SessionBounds):
        return SessionState(partition, cache, serde, bounds)
    if isinstance(bounds, SlidingBounds):
        return SlidingState(partition, cache, serde, bounds)
    if isinstance(bounds, IntervalJoinBounds):
        return IntervalJoinState(partition, cache, serde, bounds)
    if isinstance(bounds, ForeignKeyJoinBounds):
        return ForeignKeyJoinState(partition, cache, serde, bounds)
    if isinstance(bounds, TableJoinBounds):
        return TableJoinState(partition, cache, serde, bounds)
    return WindowState(partition, cache, serde, bounds)


class PartitionTransaction:
    """Uncommitted work on one source partition: state changes per store and the next offset.

    Per message: `begin_message`, the steps, then `accept_message` (its writes stay) or
    `discard_message` / `pass_message` (they are undone)."""

    def __init__(
        self,
        partition: int,
        stores: dict[str, StorePartition],
        serde: Serde,
        committed_offset: int | None,
        live_stores: Mapping[str, WindowBounds | SessionBounds | None] | None = None,
        ttls: Mapping[str, int] | None = None,
        stream_times: Mapping[str, int] | None = None,
        timer_store: str | None = None,
        exactly_once: bool = False,
    ) -> None:
        """live_stores: the stores of aggregations, whose steps get a `live.LiveState` instead of a
        `State`, or, with the bounds of their windows or sessions, a `window_state.WindowState` or a
        `session_state.SessionState`; ttls: the TTL (ms)
        of the key-value stores whose entries expire, whose steps get a `ttl.TtlState`;
        stream_times: the stream time of each window, TTL or timer store that the last commit recorded;
        timer_store: the key-value store that keeps the app's timers (`timers.TimerQueue`), deleted
        as they fire under `exactly_once`, else by the commit after their firing's."""
        live_stores, ttls = live_stores or {}, ttls or {}
        self.partition = partition
        self.stores = stores
        self.caches = {
            name: StoreCache(LiveSerializer(name, serde) if name in live_stores else None) for name in stores
        }
        self.states: dict[str, State] = {
            name: TtlState(stores[name], self.caches[name], serde, ttls[name])
            if name in ttls
            else State(stores[name], self.caches[name], serde)
            for name in stores
            if name not in live_stores
        }
        """The key-value stores' state, as stateful steps see it."""
        self.expiring = [state for state in self.states.values() if isinstance(state, TtlState)]
        self._evicting = [name for name, store in stores.items() if store.evicts]
        """The stores whose entries expire: each message's timestamp goes to their `observe`."""
        self.live = {
            name: LiveState(stores[name], self.caches[name], serde)
            for name, bounds in live_stores.items()
            if name in stores and bounds is None
        }
        """The keyed aggregations' stores."""
        self.windows: dict[str, WindowState] = {
            name: _window_view(stores[name], self.caches[name], serde, bounds)
            for name, bounds in live_stores.items()
            if name in stores and bounds is not None
        }
        """The windowed (and session) aggregations' stores."""
        self.views: dict[str, State | LiveState | WindowState] = {**self.states, **self.live, **self.windows}
        """Every store, by name: what the steps get."""
        self.timers: TimerQueue | None = None
        """The app's timers in this partition, when it has any."""
        if timer_store is not None and timer_store in self.states:
            self.timers = TimerQueue(stores[timer_store], self.caches[timer_store], delete_on_fire=exactly_once)
            self.states[timer_store].timers = self.timers
        self.clocked: dict[str, TtlState | WindowState | TimerQueue] = {
            name: state for name, state in self.views.items() if isinstance(state, TtlState | WindowState)
        }
        """The stores that keep stream time, by name."""
        if self.timers is not None and timer_store is not None:
            self.clocked[timer_store] = self.timers
        self.observing: list[TtlState | TimerQueue] = [*self.expiring, *([self.timers] if self.timers else [])]
        """What each message's timestamp goes to (`observe`): the expiring stores and the timers."""
        for name, state in self.clocked.items():
            state.start_from((stream_times or {}).get(name))
        self.window_list = list(self.windows.values())
        self.participant: Participant | None = None
        """Work outside the stores that commits with the partition (its tables), when there is some."""
        self._state_list = list(self.views.values())
        self._sampled: list[tuple[KeyView, type[KeyView]]] = [
            (view, _TIMED[type(view)]) for view in self._state_list if type(view) in _TIMED
        ]
        """The views whose operations bursts of messages time, with their timed class."""
        self._cache_list = list(self.caches.values())
        self.journals = [cache.journal for cache in self._cache_list]
        """The current message's writes, per store (see `accept_message`)."""
        self.next_offset: int | None = committed_offset
        """Offset of the next message to process on the source partition."""
        self.committed_offset = committed_offset
        self.emitted: dict[bytes, int] = {}
        """Keys whose results an aggregation emitting per commit sent since the last commit, with the
        offset of the write sent (see `processing.emission`)."""
        self._time_next_messages(TIMED_BURST)

    @property
    def has_progress(self) -> bool:
        if self.participant is not None and self.participant.needs_commit and self.next_offset is not None:
            return True
        return self.next_offset is not None and self.next_offset != self.committed_offset

    @property
    def expiries_due(self) -> bool:
        """Whether a store holds windows or entries that the last commit's stream time expired: the
        next commit deletes them, even without progress."""
        return any(state.expiries_due for state in self.clocked.values())

    @property
    def offset_to_commit(self) -> int:
        """The source offset a commit records: the next message to process (only with progress)."""
        if self.next_offset is None:
            raise StateStoreError(f"partition {self.partition} has processed nothing: there is no offset to commit")
        return self.next_offset

    @property
    def cached_bytes(self) -> int:
        """Bytes held by this partition's record caches (see `cache.StoreCache`)."""
        return sum(cache.bytes for cache in self.caches.values())

    def begin_message(self, message_key: bytes, offset: int) -> None:
        """The message at source `offset`, keyed `message_key`, is about to go through the steps."""
        self.begin_scoped(message_prefix(message_key), offset)

    def begin_scoped(self, prefix: bytes, offset: int) -> None:
        """`begin_message` with the message key's `keys.message_prefix` already made."""
        for state in self._state_list:
            state._bind(prefix, offset)

    def _time_next_messages(self, count: int) -> None:
        """Time the state operations of the next `count` messages."""
        for view, timed in self._sampled:
            view._metrics.timed_messages_left = count
            view.__class__ = timed

    def accept_message(self, offset: int) -> None:
        """The message at `offset` succeeded: its writes stay in the cache, tagged with its offset."""
        for journal in self.journals:
            if journal:
                journal.clear()
        self.next_offset = offset + 1

    def discard_message(self) -> None:
        """Undo the current message's writes (and forget what windows they opened, closed or expired)."""
        for window in self.window_list:
            if window.writing:
                window.forget()
        for cache in self._cache_list:
            if cache.journal:
                cache.undo()

    def pass_message(self, offset: int) -> None:
        """A message that was skipped or dead-lettered: it moves the offset but changes no state."""
        self.discard_message()
        self.next_offset = offset + 1

    def prepare_commit(self) -> None:
        """Before a commit: the expiring stores delete what stream time has reached (and keep their
        stream time), and the bounded stores delete what the commit would push out of them; the
        commit carries those deletes (and their tombstones) with the rest."""
        if self.next_offset is None:
            return
        offset = self.next_offset - 1
        for state in self.expiring:
            state.expire(offset)
        for window in self.window_list:
            window.expire_committed(offset)
        if self.timers is not None:
            self.timers.prepare(offset)
        for name in self._evicting:
            self._evict(name, offset)

    def _evict(self, name: str, offset: int) -> None:
        cache = self.caches[name]
        values = cache.values
        by_last_write = sorted(cache.dirty, key=cache.dirty.__getitem__)  # the least recently written first
        for key in self.stores[name].evictions([(key, values[key]) for key in by_last_write]):
            if cache.serialize is None:
                cache.put(key, None, offset)
            else:
                cache.delete_live(key, offset)
        cache.accept()

    def stream_times_to_commit(self) -> dict[str, int]:
        """The stream time of each store that keeps it, as the commit being prepared records it."""
        times = {name: state.stream_time_to_commit for name, state in self.clocked.items()}
        kept = {name: time for name, time in times.items() if time is not None and time >= 0}
        return kept if self.participant is None else {**kept, **self.participant.positions_to_commit()}

    @property
    def committed_stream_times(self) -> dict[str, int]:
        """The stream time of each store that keeps it, as the last commit recorded it (where known)."""
        times = {name: state.committed_stream_time for name, state in self.clocked.items()}
        kept = {name: time for name, time in times.items() if time is not None and time >= 0}
        return kept if self.participant is None else {**kept, **self.participant.committed_positions()}

    def changes(self, store: str) -> list[Change]:
        """(key, serialized value or None for a delete, source offset), each changed key once; then the
        committed value of each key a restore asked to write again (`StorePartition.keys_to_rewrite`)
        that the commit does not change."""
        changes = self.caches[store].changes()
        rewrite = self.stores[store].keys_to_rewrite
        if rewrite:
            dirty = self.caches[store].dirty
            keys = sorted(key for key in rewrite if key not in dirty)
            values = self.stores[store].get_many(keys) if keys else []
            changes.extend(zip(keys, values, repeat(self.first_offset, len(keys)), strict=True))
        return changes

    @property
    def first_offset(self) -> int:
        """The lowest source offset the changes since the last commit can come from (0 before the first)."""
        return self.committed_offset or 0

    def roll_back(self) -> None:
        """Drop every uncommitted change: the partition is processed again from `committed_offset`."""
        for cache in self.caches.values():
            cache.drop_dirty()
        self.discard_message()
        for window in self.window_list:
            window.forget()
        for store in self.observing:
            store.forget()
        self.emitted.clear()
        self.next_offset = self.committed_offset
        if self.participant is not None:
            self.participant.roll_back()

    def committed(self) -> None:
        """Everything up to `next_offset` is durable: start a new transaction (the cache stays, clean)."""
        for state in self.clocked.values():
            state.mark_committed()  # before the caches are clean: a window store reads its dirty stream time
        if self.timers is not None:
            self.timers.committed()
        for cache in self.caches.values():
            cache.mark_clean()
        for store in self.stores.values():
            store.keys_to_rewrite.clear()
        self.emitted.clear()
        if self.participant is not None:
            self.participant.committed()
        processed = (self.next_offset or 0) - (self.committed_offset or 0)
        self._time_next_messages(min(TIMED_BURST, max(1, processed // SAMPLE_EVERY)))
        self.committed_offset = self.next_offset
