"""How long operations took, kept in fixed memory however long a run lasts.

Owns `LatencyHistogram`, a log-linear histogram of durations (HdrHistogram's layout: 16 buckets per
doubling of nanoseconds, so a percentile it reports is within 1/16 of the true one), which merges
across store partitions, and `Latency`, its summary in a report: how many durations it holds, their
mean (exact) and their p50 and p99 (to that precision), in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

_SIGNIFICANT_BITS: Final = 5
_SUB_BUCKETS: Final = 1 << (_SIGNIFICANT_BITS - 1)
"""Buckets per doubling: a bucket is at most 1/16 of its values wide."""


@dataclass(frozen=True)
class Latency:
    """A distribution of durations (seconds); all zero when nothing was measured."""

    samples: int = 0
    mean_seconds: float = 0.0
    p50_seconds: float = 0.0
    p99_seconds: float = 0.0


def bucket_of(nanos: int) -> int:
    """The bucket of a duration in nanoseconds: its 5 leading bits and their position."""
    shift = max(0, nanos.bit_length() - _SIGNIFICANT_BITS)
    return shift * _SUB_BUCKETS + (nanos >> shift)


def bucket_middle(bucket: int) -> int:
    """The duration (nanoseconds) in the middle of `bucket`'s range."""
    shift = max(0, bucket // _SUB_BUCKETS - 1)
    low = (bucket - shift * _SUB_BUCKETS) << shift
    return low + ((1 << shift) - 1) // 2


class LatencyHistogram:
    """Durations recorded one by one (`record`), summarized by `summary`."""

    __slots__ = ("buckets", "count", "total_seconds")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total_seconds = 0.0

    def record(self, seconds: float) -> None:
        nanos = int(seconds * 1e9)
        shift = nanos.bit_length() - _SIGNIFICANT_BITS  # `bucket_of`, inlined: a sampled call pays for this
        bucket = nanos if shift <= 0 else shift * _SUB_BUCKETS + (nanos >> shift)
        buckets = self.buckets
        buckets[bucket] = buckets.get(bucket, 0) + 1
        self.count += 1
        self.total_seconds += seconds

    def merge(self, other: LatencyHistogram) -> None:
        """Add `other`'s durations to this histogram's."""
        for bucket, count in other.buckets.items():
            self.buckets[bucket] = self.buckets.get(bucket, 0) + count
        self.count += other.count
        self.total_seconds += other.total_seconds

    def percentile(self, fraction: float) -> float:
        """The duration (seconds) that `fraction` (0.5, 0.99) of the recorded ones do not exceed; 0 when empty."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(fraction * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return bucket_middle(bucket) / 1e9
        raise AssertionError("the buckets hold fewer durations than counted")

    def summary(self) -> Latency:
        if not self.count:
            return Latency()
        return Latency(self.count, self.total_seconds / self.count, self.percentile(0.5), self.percentile(0.99))


def merged(histograms: Iterable[LatencyHistogram]) -> LatencyHistogram:
    """One histogram holding every duration of `histograms`."""
    total = LatencyHistogram()
    for histogram in histograms:
        total.merge(histogram)
    return total
