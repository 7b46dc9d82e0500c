"""Windows of idle partitions closed by the wall clock: what `final(advance_when_idle=...)` asks for.

Owns `IdleWindows`. A window, session or sliding window closes when the stream time of its
partition passes its end plus the grace, and only records move stream time (Kafka Streams' rule):
a partition whose source has gone quiet keeps its last windows open, and `final()` never sends
them. With `advance_when_idle`, once a partition has processed no record for that long by the
wall clock, its stream time moves on with the wall clock from where its last record left it (the
stream time then, plus the wall-clock time since), checked on each turn of the worker's loop;
the windows that closes are sent as a record closing them would send them (through the steps
after the window, to the output topic under each window's key, in the commit's transaction under
exactly-once), and the new stream time is written and committed as a record's would be. A record
arriving later is judged against that stream time (it may be late). The idle time counts from the
partition's last record in this run, or from the start of the run: a bounded worker closes idle
windows only while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Message

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.steps import IdleWindowStep, StepFailed
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.state.transaction import PartitionTransaction

__all__ = ["IdleWindows", "idle_windows"]


def idle_windows(
    config: AppConfig,
    dataframe: StreamingDataFrame,
    produce: Callable[[str, bytes | None, bytes], None],
    bad_input: BadInputHandler,
    clock: Callable[[], int] | None = None,
) -> IdleWindows | None:
    """What closes the windows of idle partitions, if a window step asks for it. `clock`: the wall
    clock in ms (the machine's by default)."""
    steps = dataframe.idle_windows
    if not steps:
        return None
    output = config.output if config.emits_output else None
    return IdleWindows(
        steps, config.task_topic, output, config.output_serde.dumps, produce, bad_input, clock or _wall_clock_ms
    )


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Activity:
    """A partition's last record as the idle check saw it."""

    next_offset: int | None
    seen_at: int
    """Wall-clock ms when the check first saw the partition at `next_offset`."""
    stream_times: dict[str, int]
    """Each idle window store's stream time then (known once the partition went idle)."""


class IdleWindows:
    """Moves the stream time of idle partitions' window stores with the wall clock, and sends what closes."""

    def __init__(
        self,
        steps: list[IdleWindowStep],
        source: str,
        output: str | None,
        dumps: Callable[[object], bytes],
        produce: Callable[[str, bytes | None, bytes], None],
        bad_input: BadInputHandler,
        clock: Callable[[], int],
    ) -> None:
        self._steps = steps
        self._source = source
        self._output = output
        self._dumps = dumps
        self._produce = produce
        self._bad_input = bad_input
        self._clock = clock
        self._activity: dict[int, _Activity] = {}
        self.closed = 0
        """Windows closed by idle advances in this run (sent again after a roll-back too)."""

    def on_wall_clock(self, transactions: Iterable[PartitionTransaction]) -> int:
        """Close what idleness closes in every partition; returns how many windows closed."""
        now, closed = self._clock(), 0
        for txn in transactions:
            activity = self._activity.get(txn.partition)
            if activity is None or activity.next_offset != txn.next_offset:
                self._activity[txn.partition] = _Activity(txn.next_offset, now, {})
                continue
            if txn.next_offset is None:
                continue  # a partition that never processed a record has no stream time to move
            for step in self._steps:
                idle_for = now - activity.seen_at
                if idle_for >= step.idle_ms:
                    closed += self._advance(txn, step, activity, idle_for)
        self.closed += closed
        return closed

    def _advance(self, txn: PartitionTransaction, step: IdleWindowStep, activity: _Activity, idle_for: int) -> int:
        state = txn.windows[step.store]
        base = activity.stream_times.setdefault(step.store, state.stream_time)
        if base < 0:
            return 0  # no record with a timestamp yet
        target, due = base + idle_for, state.next_close
        if due is None or due > target:
            return 0
        assert txn.next_offset is not None
        offset = txn.next_offset - 1
        txn.begin_message(b"", offset)
        closed = state.advance_idle(target)
        txn.accept_message(offset)
        try:
            results = step.closed_results(closed)
        except StepFailed as failure:
            where = Message(topic=self._source, partition=txn.partition, offset=offset, key=None)
            self._bad_input.handle(where, f"windows closed by idleness in store {step.store!r}", failure.error)
            return len(closed)
        if self._output is not None:
            for key, value in results:
                self._produce(self._output, key, self._dumps(value))
        return len(closed)
