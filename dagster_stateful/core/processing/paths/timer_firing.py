"""Firing the app's timers: its `on_timer` function run for each timer that came due.

Owns `TimerFiring`. Stream-time timers fire on the per-message path, between two messages of their
partition: once the messages before have brought its stream time to their due time, before the
next message is processed. Wall-clock timers fire from the worker's loop, in every partition it
processes, also one whose source is quiet. Each firing is a unit of work of its partition, as a
message is: the function's writes and the timer's own deletion (see `state.timers`) are tagged
with the offset of the last message processed, its result goes to the output topic under the
timer's key (in the commit's transaction under exactly-once), and what it raises goes to the error
policy with the timer's key, partition and that offset, the timer counting as fired.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from confluent_kafka import Message

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.steps import StepFailed
from dagster_stateful.core.processing.dsl.timers import OnTimer
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.state.timers import Timer
from dagster_stateful.core.state.transaction import PartitionTransaction

__all__ = ["TimerFiring", "timer_firing"]


def timer_firing(
    config: AppConfig,
    dataframe: StreamingDataFrame,
    produce: Callable[[str, bytes | None, bytes], None],
    bad_input: BadInputHandler,
) -> TimerFiring | None:
    """What fires the app's timers, if it handles any (`StreamingDataFrame.on_timer`)."""
    if dataframe.timers is None:
        return None
    output = config.output if config.emits_output else None
    return TimerFiring(dataframe.timers, config.task_topic, output, config.output_serde.dumps, produce, bad_input)


class TimerFiring:
    """Runs `on_timer` for the timers due in a partition transaction."""

    def __init__(
        self,
        on_timer: OnTimer,
        source: str,
        output: str | None,
        dumps: Callable[[object], bytes],
        produce: Callable[[str, bytes | None, bytes], None],
        bad_input: BadInputHandler,
    ) -> None:
        self._on_timer = on_timer
        self._source = source
        self._output = output
        self._dumps = dumps
        self._produce = produce
        self._bad_input = bad_input
        self.fired = 0
        """Timers fired in this run (their firings may be done again after a roll-back)."""

    def fire_stream(self, txn: PartitionTransaction) -> int:
        """Fire the partition's stream-time timers that its stream time has reached; how many fired."""
        timers = txn.timers
        if timers is None:
            return 0
        due = timers.next_due(False)
        if due is None or due > timers.stream_time:
            return 0
        return self._fire(txn, timers.pop_due(False, timers.stream_time))

    def on_wall_clock(self, transactions: Iterable[PartitionTransaction]) -> int:
        """Fire the wall-clock timers due now in every partition; how many fired."""
        now, fired = time.time_ns() // 1_000_000, 0
        for txn in transactions:
            timers = txn.timers
            if timers is None or txn.next_offset is None:
                continue  # a partition that never processed a message holds no timer yet
            due = timers.next_due(True)
            if due is not None and due <= now:
                fired += self._fire(txn, timers.pop_due(True, now))
        return fired

    def _fire(self, txn: PartitionTransaction, due: list[Timer]) -> int:
        timers, state = txn.timers, txn.states[self._on_timer.store]
        assert timers is not None and txn.next_offset is not None
        offset = txn.next_offset - 1
        for timer in due:
            txn.begin_message(timer.key, offset)
            try:
                result = self._on_timer.call(timer, state)
            except StepFailed as failure:
                txn.discard_message()
                timers.fired(timer, offset)
                txn.accept_message(offset)
                where = Message(topic=self._source, partition=txn.partition, offset=offset, key=timer.key)
                self._bad_input.handle(where, f"timer {timer.name!r}", failure.error)
                continue
            timers.fired(timer, offset)
            txn.accept_message(offset)
            if result is not None and self._output is not None:
                self._produce(self._output, timer.key, self._dumps(result))
        self.fired += len(due)
        return len(due)
