"""The speed targets bench_compare.py checks its figures against, and why a missed one is missed.

Each target compares an engine's median with Kafka Streams' (one stream thread) in the same run:
throughput (msg/s, or records/s for the restore) at least a multiple of Kafka Streams', and peak
RSS no higher than Kafka Streams'. `verdicts` says which are met; for a missed throughput target
bench_compare runs the engine once more under cProfile and prints `Verdict.profile`, the functions
where that run's time went.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

PEER = "kafka-streams"


class Measured(Protocol):
    """What a figure of bench_compare gives: its system, workload, median rate and median peak RSS."""

    system: str
    workload: str

    @property
    def median(self) -> float: ...

    @property
    def median_rss(self) -> float: ...


@dataclass(frozen=True)
class Target:
    workload: str
    system: str
    """The engine's system in bench_compare ("engine" or "engine-aggregate")."""
    at_least: float
    """Its median rate over Kafka Streams' at least this."""


TARGETS = (
    Target("10k keys", "engine-aggregate", 1.5),
    Target("1M keys", "engine-aggregate", 2.0),
    Target("restore", "engine", 1.0),
    Target("group_by", "engine-aggregate", 1.5),
    Target("join", "engine-aggregate", 1.5),
    Target("sessions", "engine", 1.5),
)


@dataclass
class Verdict:
    what: str
    measured: str
    met: bool
    target: Target | None = None
    """The throughput target, for a rate (None for a peak RSS)."""
    profile: str = ""


def verdicts(figures: Sequence[Measured]) -> list[Verdict]:
    """Each target whose figures this run measured: its rate ratio, then its peak RSS against Kafka Streams'."""
    by = {(figure.system, figure.workload): figure for figure in figures}
    found: list[Verdict] = []
    for target in TARGETS:
        ours, peer = by.get((target.system, target.workload)), by.get((PEER, target.workload))
        if ours is None or peer is None:
            continue
        times = ours.median / peer.median
        found.append(
            Verdict(
                f"{target.workload}: {target.system} at least {target.at_least:g}x Kafka Streams' rate",
                f"{times:.2f}x ({ours.median:,.0f} against {peer.median:,.0f})",
                times >= target.at_least,
                target,
            )
        )
        found.append(
            Verdict(
                f"{target.workload}: {target.system}'s peak RSS no higher than Kafka Streams'",
                f"{ours.median_rss:,.0f} against {peer.median_rss:,.0f} MiB",
                ours.median_rss <= peer.median_rss,
            )
        )
    return found


def print_verdicts(found: Sequence[Verdict]) -> None:
    print("\n== targets (medians of this run)")
    for verdict in found:
        print(f"{'met   ' if verdict.met else 'MISSED'}  {verdict.what}: {verdict.measured}")
    for verdict in found:
        if verdict.profile:
            print(f"\n-- why {verdict.what} is missed: the engine's run under cProfile\n{verdict.profile}")
