"""Consumer-lag evaluation the way Burrow does it, adapted to bounded workers.

Owns `LagSample` (one observation of a partition's committed offset and high watermark),
`LagWindow` (the recent samples per partition, JSON-storable in a Dagster sensor cursor),
`evaluate` (one partition's `PartitionStatus` over its window, with a reason in plain words) and
`evaluate_group` (the worst partition). Pure logic: the caller samples Kafka and supplies `now`.

A never-committed offset (None) counts as offset 0, for lag and for going backwards alike.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from enum import StrEnum

from dagster_stateful.errors import ConfigurationError

DEFAULT_WINDOW_SECONDS = 600.0
DEFAULT_MAX_SAMPLES = 10
_JSON_VERSION = 1
IDLE_REASON = "idle between bounded runs"


def partition_lag(committed: int | None, low: int, high: int) -> int:
    """Messages left in a partition: from the committed offset, or, when the group never committed
    one, from the earliest message the partition still holds (where a new group starts). The one
    definition the worker, its reports, `describe_partitions` and the lag sensor all use."""
    return max(0, high - (low if committed is None else committed))


@dataclass(frozen=True)
class LagSample:
    timestamp: float
    """When the sample was taken, in seconds."""
    committed: int | None
    """The group's committed offset (the next message to process); None when never committed."""
    high: int
    """The partition's high watermark."""
    low: int = 0
    """The partition's low watermark (where a group that never committed starts)."""

    @property
    def lag(self) -> int:
        return partition_lag(self.committed, self.low, self.high)


class PartitionStatus(StrEnum):
    """Burrow's partition statuses, declared from least to most severe."""

    OK = "OK"
    WARN = "WARN"
    STALL = "STALL"
    STOP = "STOP"
    REWIND = "REWIND"

    @property
    def severity(self) -> int:
        return list(PartitionStatus).index(self)


@dataclass(frozen=True)
class PartitionEvaluation:
    status: PartitionStatus
    lag: int
    """Lag at the newest sample (0 without samples)."""
    reason: str


@dataclass
class LagWindow:
    """The most recent `max_samples` samples per partition, none older than `window_seconds`.

    The JSON form holds only the samples (state); the limits are the caller's configuration.
    """

    window_seconds: float = DEFAULT_WINDOW_SECONDS
    max_samples: int = DEFAULT_MAX_SAMPLES
    samples: dict[int, list[LagSample]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window_seconds <= 0 or self.max_samples < 1:
            raise ConfigurationError(
                f"a lag window needs window_seconds > 0 and max_samples >= 1, got {self.window_seconds} and "
                f"{self.max_samples}"
            )

    def add(self, partition: int, sample: LagSample, now: float | None = None) -> None:
        """Record a sample, then trim every partition as of `now` (default: the sample's time)."""
        kept = self.samples.setdefault(partition, [])
        kept.append(sample)
        kept.sort(key=lambda s: s.timestamp)
        self.trim(sample.timestamp if now is None else now)

    def trim(self, now: float) -> None:
        """Drop samples older than the window and beyond `max_samples`, then empty partitions."""
        recent = {p: [s for s in kept if now - s.timestamp <= self.window_seconds] for p, kept in self.samples.items()}
        self.samples = {p: kept[-self.max_samples :] for p, kept in recent.items() if kept}

    def get(self, partition: int) -> list[LagSample]:
        return list(self.samples.get(partition, []))

    def to_json(self) -> dict:
        return {
            "version": _JSON_VERSION,
            "partitions": {
                str(p): [[s.timestamp, s.committed, s.high, s.low] for s in kept]
                for p, kept in sorted(self.samples.items())
            },
        }

    @classmethod
    def from_json(
        cls, data: object, window_seconds: float = DEFAULT_WINDOW_SECONDS, max_samples: int = DEFAULT_MAX_SAMPLES
    ) -> LagWindow:
        """The window stored in `data`, or an empty one when `data` is malformed in any way."""
        window = cls(window_seconds, max_samples)
        try:
            loaded = _partitions_from_json(data)
        except (KeyError, TypeError, ValueError, OverflowError):
            return window
        window.samples = {
            p: sorted(kept, key=lambda s: s.timestamp)[-max_samples:] for p, kept in loaded.items() if kept
        }
        return window


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _partitions_from_json(data: object) -> dict[int, list[LagSample]]:
    if not isinstance(data, dict) or data.get("version") != _JSON_VERSION:
        raise ValueError("not a lag window")
    partitions = data["partitions"]
    if not isinstance(partitions, dict):
        raise ValueError("partitions is not a mapping")
    loaded = {}
    for key, items in partitions.items():
        if not isinstance(key, str) or not key.isdigit() or not isinstance(items, list):
            raise ValueError(f"bad partition entry: {key!r}")
        loaded[int(key)] = [_sample_from_json(item) for item in items]
    return loaded


def _sample_from_json(item: object) -> LagSample:
    if not isinstance(item, list) or len(item) not in (3, 4):
        raise ValueError(f"not a sample: {item!r}")
    timestamp, committed, high, low = item if len(item) == 4 else [*item, 0]  # 3: written before `low` was kept
    if not (_is_int(timestamp) or isinstance(timestamp, float)) or not math.isfinite(timestamp):
        raise ValueError(f"bad timestamp: {timestamp!r}")
    if not (committed is None or _is_int(committed)) or not _is_int(high) or not _is_int(low):
        raise ValueError(f"bad offsets: {item!r}")
    return LagSample(float(timestamp), committed, high, low)


def evaluate(samples: list[LagSample], now: float, window_seconds: float, idle_by_design: bool) -> PartitionEvaluation:
    """One partition's status over its window of samples, by Burrow's rules in Burrow's order.

    With `idle_by_design` (a bounded worker that does not commit between runs), STALL and STOP
    become OK, or WARN when the lag grew across the window.
    """
    ordered = sorted(samples, key=lambda s: s.timestamp)
    if not ordered:
        return PartitionEvaluation(PartitionStatus.OK, 0, "no samples yet")
    status, reason = _judge(ordered, now, window_seconds, idle_by_design)
    return PartitionEvaluation(status, ordered[-1].lag, reason)


def _judge(
    ordered: list[LagSample], now: float, window_seconds: float, idle_by_design: bool
) -> tuple[PartitionStatus, str]:
    n, first, last = len(ordered), ordered[0], ordered[-1]
    offsets = [s.committed or 0 for s in ordered]
    caught_up = sum(1 for s in ordered if s.lag == 0)
    if caught_up:
        return PartitionStatus.OK, f"caught up: lag was 0 in {caught_up} of {n} samples"
    if n < 2:
        return PartitionStatus.OK, f"not enough samples: 1 sample, lag {last.lag}"
    for before, after in itertools.pairwise(offsets):
        if after < before:
            return (PartitionStatus.REWIND, f"committed offset went back from {before} to {after} (lag now {last.lag})")
    stuck = _stuck(ordered, offsets, now, window_seconds)
    if stuck:
        return _idle(ordered, offsets[-1], *stuck[:2]) if idle_by_design else (stuck[0], stuck[2])
    lags = [s.lag for s in ordered]
    if all(a <= b for a, b in itertools.pairwise(lags)) and last.lag > first.lag:
        return PartitionStatus.WARN, (
            f"lag grew from {first.lag} to {last.lag} over {n} samples "
            f"although the committed offset moved from {offsets[0]} "
            f"to {offsets[-1]}"
        )
    return PartitionStatus.OK, (
        f"committed offset moved from {offsets[0]} to {offsets[-1]}, lag "
        f"went from {first.lag} to {last.lag} over {n} samples"
    )


def _stuck(
    ordered: list[LagSample], offsets: list[int], now: float, window_seconds: float
) -> tuple[PartitionStatus, float, str] | None:
    """STOP or STALL, how long the committed offset has not moved, and why; None when moving.

    A move is dated at the first sample showing it; an offset that never moved, at the oldest.
    """
    moves = [ordered[i].timestamp for i in range(1, len(ordered)) if offsets[i] != offsets[i - 1]]
    still_for, lag = now - (moves[-1] if moves else ordered[0].timestamp), ordered[-1].lag
    if still_for > window_seconds:
        return (
            PartitionStatus.STOP,
            still_for,
            (
                f"committed offset {offsets[-1]} has not moved for {still_for:.0f}s, longer than the "
                f"{window_seconds:.0f}s window, with lag {lag}"
            ),
        )
    if moves:
        return None
    span = ordered[-1].timestamp - ordered[0].timestamp
    return (
        PartitionStatus.STALL,
        still_for,
        (f"committed offset {offsets[-1]} did not move over {len(ordered)} samples ({span:.0f}s) with lag {lag}"),
    )


def _idle(
    ordered: list[LagSample], offset: int, would_be: PartitionStatus, still_for: float
) -> tuple[PartitionStatus, str]:
    n, first, last = len(ordered), ordered[0], ordered[-1]
    if last.lag > first.lag:
        return PartitionStatus.WARN, (
            f"lag grew from {first.lag} to {last.lag} over {n} samples "
            f"while {IDLE_REASON} (committed offset {offset} unchanged "
            f"for {still_for:.0f}s)"
        )
    return PartitionStatus.OK, (
        f"{IDLE_REASON}: would be {would_be.value}, committed offset "
        f"{offset} unchanged for {still_for:.0f}s, lag {last.lag} did not "
        f"grow over {n} samples"
    )


def evaluate_group(evaluations: dict[int, PartitionEvaluation]) -> PartitionStatus:
    """The group's status: its worst partition's (OK when it has none)."""
    return max((e.status for e in evaluations.values()), key=lambda s: s.severity, default=PartitionStatus.OK)
