"""Interval joins of two streams: what `StreamingDataFrame.join_interval` declares, and how its steps run.

Owns `JoinedStream` (the second stream, declared with `App.stream`: a topic co-partitioned with the
app's task topic, keyed alike), `IntervalJoin` (the definition: how far before and after a left
record its right records may lie, the grace for late records, inner, left or outer) and the two
calls of a join step: the left one for the app's own records (it runs in the steps' chain) and the
right one for the joined stream's (`worker.joined_streams` runs it, then the steps after the join).
Each returns the `Emitted` results: one per pair the record made, merged (`on_merge`: "raise" on a
field both have, "keep-left", "keep-right", or a function `(left, right) -> value`, given None for
a side that found no partner), and the records that stream time closed unmatched, sent alone
(left and outer joins), all under their message key; or `LATE` (see `state.interval_join_state`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Self

from dagster_stateful.core.processing.dsl.steps import StepFailed
from dagster_stateful.core.processing.dsl.windows import LATE, Emitted, window_changelog_config
from dagster_stateful.core.state.interval_join_state import LEFT, RIGHT, IntervalJoinBounds, IntervalJoinState
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.stores import Duration, as_ms
from dagster_stateful.errors import ConfigurationError, StateStoreError

__all__ = [
    "IntervalJoin",
    "IntervalJoinDeclarations",
    "IntervalJoinHow",
    "JoinedStream",
    "StreamJoin",
    "interval_join_calls",
]

IntervalJoinHow = Literal["inner", "left", "outer"]
PairMerge = Literal["raise", "keep-left", "keep-right"] | Callable[[Any, Any], Any]
SideCall = Callable[[Any, Any], Emitted]
"""(value, states by store) -> the join's results for a record of one side."""


@dataclass(frozen=True, eq=False)
class JoinedStream:
    """A stream joined with the app's own: the topic `topic`, co-partitioned with the app's task
    topic (as many partitions, keyed alike), read beside it partition for partition."""

    name: str
    topic: str
    value_serde: Serde


@dataclass(frozen=True)
class IntervalJoin:
    """A left record at t joins right records at t - before .. t + after (ms, both inclusive)."""

    stream: JoinedStream
    before: int
    after: int
    grace: int
    how: IntervalJoinHow

    kind = "interval join"

    @classmethod
    def define(
        cls,
        stream: JoinedStream,
        within: Duration | None,
        before: Duration | None,
        after: Duration | None,
        grace: Duration,
        how: IntervalJoinHow,
    ) -> IntervalJoin:
        if not isinstance(stream, JoinedStream):
            raise ConfigurationError(f"join_interval needs a stream from App.stream(...), got {stream!r}")
        if how not in ("inner", "left", "outer"):
            raise ConfigurationError(f"join_interval how= is 'inner', 'left' or 'outer', got {how!r}")
        if within is None and before is None and after is None:
            raise ConfigurationError("join_interval needs within= (or before= and after=): how far apart records join")
        default = 0 if within is None else as_ms(within, "the join's time difference")
        before_ms = default if before is None else as_ms(before, "the join's before")
        after_ms = default if after is None else as_ms(after, "the join's after")
        grace_ms = as_ms(grace, "the join's grace")
        if before_ms < 0 or after_ms < 0 or grace_ms < 0 or (before_ms + after_ms == 0 and within is None):
            raise ConfigurationError(
                f"join_interval needs before, after and grace of 0 or more, not all of the window 0 "
                f"(got before {before_ms} ms, after {after_ms} ms, grace {grace_ms} ms)"
            )
        return cls(stream, before_ms, after_ms, grace_ms, how)

    @property
    def size(self) -> int:
        return self.before + self.after

    @property
    def retention(self) -> int:
        """How long a record is kept after its timestamp, at most: until it can join nothing more."""
        return max(self.before, self.after) + self.grace + 1

    @property
    def bounds(self) -> IntervalJoinBounds:
        unmatched = (self.how in ("left", "outer"), self.how == "outer")
        return IntervalJoinBounds(self.size, self.grace, self.retention, self.before, self.after, unmatched)

    def changelog_config(self) -> dict[str, str]:
        return window_changelog_config(self.retention)


def join_side_calls(store: str, name: str, results: Callable[[Any, int, Any], Emitted]) -> tuple[SideCall, SideCall]:
    """A join with another stream's calls for a left record (the app's) and a right one (the joined
    stream's): `results(state of store, side, value)`. What they raise, but a damaged store, is the
    record's failure (`StepFailed`)."""

    def side_call(side: int) -> SideCall:
        def joined(value: Any, states: Any) -> Emitted:
            try:
                return results(states[store], side, value)
            except StateStoreError:
                raise
            except Exception as error:
                raise StepFailed(name, error) from error

        joined.__name__ = name
        return joined

    return side_call(LEFT), side_call(RIGHT)


def interval_join_calls(store: str, name: str, on_merge: PairMerge) -> tuple[SideCall, SideCall]:
    """The interval join's calls (`join_side_calls`): the pairs a record made and the records stream
    time closed unmatched, or `LATE`."""
    merge = pair_merge(on_merge)

    def results(state: IntervalJoinState, side: int, value: Any) -> Emitted:
        if state.timestamp < 0:
            raise ValueError("the record has no timestamp, which an interval join needs")
        pairs, closed = state.join_record(side, value)
        if pairs is None:
            return LATE
        return Emitted([(key, merge(left, right)) for key, left, right in closed + pairs])

    return join_side_calls(store, name, results)


def pair_merge(on_merge: PairMerge) -> Callable[[Any, Any], Any]:
    """What merges a join's two values (either may be None: a side without a partner)."""
    if callable(on_merge):
        return on_merge
    if on_merge not in ("raise", "keep-left", "keep-right"):
        raise ConfigurationError(
            f"join_interval on_merge= is 'raise', 'keep-left', 'keep-right' or a function, got {on_merge!r}"
        )

    def merge(left: Any, right: Any) -> Any:
        if left is None or right is None:
            return left if right is None else right
        if not isinstance(left, dict) or not isinstance(right, dict):
            raise TypeError(
                f"merging needs dict values on both sides, got {type(left).__name__} and {type(right).__name__}: "
                "pass on_merge=a function (left, right) -> merged"
            )
        if on_merge == "keep-left":
            return {**right, **left}
        if on_merge == "keep-right":
            return {**left, **right}
        both = sorted(set(left) & set(right))
        if both:
            raise ValueError(
                f"the two records both have fields {both}: choose on_merge='keep-left', 'keep-right' or a function"
            )
        return {**left, **right}

    return merge


@dataclass(frozen=True)
class StreamJoin:
    """An app's join with another stream (an interval join, or a table join) as its worker runs it:
    the definition, the store of both sides, the call for the joined stream's records, and where the
    steps after the join start in the chain."""

    join: Any
    store: str
    right: SideCall
    after_index: int

    @property
    def stream(self) -> JoinedStream:
        return self.join.stream


class IntervalJoinDeclarations:
    """`join_interval`, for a frame that adds its step (`_add_interval_join`)."""

    def join_interval(
        self,
        other: JoinedStream,
        *,
        within: Duration | None = None,
        before: Duration | None = None,
        after: Duration | None = None,
        grace: Duration = 0,
        how: IntervalJoinHow = "inner",
        on_merge: PairMerge = "raise",
        store: str | None = None,
    ) -> Self:
        """Join each record with the records of `other` (`App.stream`) of the same message key whose
        timestamps lie from `before` before to `after` after its own (`within`: both), Kafka Streams'
        `KStream.join(other, joiner, JoinWindows.ofTimeDifferenceAndGrace(within, grace))`. Each pair
        is merged (`on_merge`: "raise" on a field both have, "keep-left", "keep-right", or a function
        `(left, right) -> value`) and sent once, when the second of the two arrives. how="left" also
        sends each record that found no partner, alone, once stream time has passed its timestamp
        plus `after` plus `grace`; "outer" does the same for `other`'s records (past `before` plus
        `grace`). A record more than `grace` behind stream time is late (the error policy's
        `handle_late`). Both sides are kept in `store` (the app's only store unless named; no other
        step may use it) until they can join nothing more; its changelog is compacted and deleted
        past that retention. The two topics must be co-partitioned; only stateless steps may follow."""
        join = IntervalJoin.define(other, within, before, after, grace, how)
        name = f"join {other.name}"
        left, right = interval_join_calls(self._join_store(store), name, on_merge)
        return self._add_stream_join(join, left, right, name, store)

    def _join_store(self, store: str | None) -> str:
        raise NotImplementedError

    def _add_stream_join(self, join: Any, left: SideCall, right: SideCall, name: str, store: str | None) -> Self:
        raise NotImplementedError
