"""An interval join recomputed plainly from its definition, record by record, for the tests to judge by.

A left record at t and a right record at t' of one key join when t - before <= t' <= t + after. In
processing order: a record more than `grace` behind the stream time (the largest timestamp of
either side so far) is late and changes nothing; any other joins every earlier record of the other
side of its key in reach that was not late, and stream time moves to it. A left record closes
once stream time passes t + after + grace, a right one t' + before + grace; those of a side that is
sent alone (left of a left join, both of an outer one) that joined nothing are then sent alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

Record = tuple[str, str, int, Any]
"""(side "L" or "R", key, timestamp, value), in processing order."""
Result = tuple[str, Any, Any]
"""(key, left value or None, right value or None)."""


@dataclass
class _Kept:
    side: str
    key: str
    timestamp: int
    value: Any
    joined: bool = False
    sent_alone: bool = False


@dataclass
class IntervalJoinModel:
    before: int
    after: int
    grace: int
    how: str
    stream_time: int = -1
    kept: list[_Kept] = field(default_factory=list)

    def process(self, record: Record) -> list[Result] | None:
        """What the record sends (None: it is late)."""
        side, key, timestamp, value = record
        if timestamp + self.grace < self.stream_time:
            return None
        mine = _Kept(side, key, timestamp, value)
        results: list[Result] = []
        for other in self.kept:
            if other.side != side and other.key == key and self._in_reach(mine, other):
                other.joined = mine.joined = True
                left, right = (mine, other) if side == "L" else (other, mine)
                results.append((key, left.value, right.value))
        self.kept.append(mine)
        self.stream_time = max(self.stream_time, timestamp)
        for kept in self.kept:
            if self._sent_alone(kept.side) and not kept.joined and not kept.sent_alone:
                reach = self.after if kept.side == "L" else self.before
                if kept.timestamp + reach + self.grace < self.stream_time:
                    kept.sent_alone = True
                    results.append((kept.key, kept.value, None) if kept.side == "L" else (kept.key, None, kept.value))
        return results

    def _in_reach(self, one: _Kept, other: _Kept) -> bool:
        left, right = (one, other) if one.side == "L" else (other, one)
        return left.timestamp - self.before <= right.timestamp <= left.timestamp + self.after

    def _sent_alone(self, side: str) -> bool:
        return self.how == "outer" or (self.how == "left" and side == "L")


def expected_results(records: list[Record], before: int, after: int, grace: int, how: str) -> list[Result]:
    """Every result the join sends for `records` in this order, late records sending nothing."""
    model = IntervalJoinModel(before, after, grace, how)
    return [result for record in records for result in model.process(record) or ()]


Timed = tuple[str, int, Any]
"""A record of one partition of one side: (key, timestamp, what identifies it)."""


def outer_join_of(lefts: list[Timed], rights: list[Timed], before: int, after: int, grace: int) -> Counter[Result]:
    """The outer join of one partition's records of both sides, in any order (valid when no record
    was late: each in time joins every partner, whatever came first): each pair in reach once, and
    each record without a partner once stream time, the largest timestamp of both, passed its
    reach plus the grace."""
    stream_time = max((timestamp for _, timestamp, _ in [*lefts, *rights]), default=-1)
    results: Counter[Result] = Counter()
    joined_left, joined_right = set(), set()
    for key, at, left in lefts:
        for right_key, right_at, right in rights:
            if right_key == key and at - before <= right_at <= at + after:
                results[(key, left, right)] += 1
                joined_left.add(left)
                joined_right.add(right)
    for key, at, left in lefts:
        if left not in joined_left and at + after + grace < stream_time:
            results[(key, left, None)] += 1
    for key, at, right in rights:
        if right not in joined_right and at + before + grace < stream_time:
            results[(key, None, right)] += 1
    return results
