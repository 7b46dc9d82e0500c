"""Restore progress in a Dagster run's log, while the run restores.

Owns `RestoreProgressLog`, a restore listener that worker runs (`worker_runs`) and the restore jobs
give their app: when a store partition starts restoring, then at most every `interval` seconds
while it restores, and when it ends, the run's log says which store and partition, records done of
how many, the rate and the time left, so an operator watching the run sees a long restore advance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dagster import DagsterLogManager

from dagster_stateful.core.monitoring.listeners import RestoreListener

DEFAULT_INTERVAL_SECONDS = 5.0


@dataclass
class _Restoring:
    start: int
    end: int
    started: float
    done: int = 0
    logged: float = 0.0


class RestoreProgressLog(RestoreListener):
    """Writes each restore's progress to a run's log (`context.log`)."""

    def __init__(self, run_log: DagsterLogManager, interval: float = DEFAULT_INTERVAL_SECONDS) -> None:
        self._log = run_log
        self._interval = interval
        self._restoring: dict[tuple[str, int], _Restoring] = {}

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None:
        now = time.monotonic()
        self._restoring[(store, partition)] = _Restoring(start_offset, end_offset, now, logged=now)
        self._log.info(
            f"Restoring store {store!r} partition {partition}: changelog offsets {start_offset}..{end_offset} "
            f"({end_offset - start_offset} records)"
        )

    def on_batch_restored(self, partition: int, store: str, batch_end_offset: int, num_restored: int) -> None:
        restoring = self._restoring.get((store, partition))
        if restoring is None:
            return
        restoring.done = batch_end_offset - restoring.start
        now = time.monotonic()
        if now - restoring.logged >= self._interval:
            restoring.logged = now
            self._log.info(self._progress(store, partition, restoring, now))

    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None:
        restoring = self._restoring.pop((store, partition), None)
        seconds = 0.0 if restoring is None else time.monotonic() - restoring.started
        self._log.info(
            f"Restored store {store!r} partition {partition}: {total_restored} records applied in {seconds:.1f} s"
        )

    def on_restore_suspended(self, partition: int, store: str, total_restored: int) -> None:
        self._restoring.pop((store, partition), None)
        self._log.info(
            f"Suspended the restore of store {store!r} partition {partition} after {total_restored} records; "
            "the next owner continues from there"
        )

    @staticmethod
    def _progress(store: str, partition: int, restoring: _Restoring, now: float) -> str:
        total = max(1, restoring.end - restoring.start)
        rate = restoring.done / max(now - restoring.started, 1e-9)
        left = max(0, total - restoring.done) / max(rate, 1e-9)
        return (
            f"Restoring store {store!r} partition {partition}: {restoring.done} of {total} records "
            f"({100 * restoring.done / total:.0f}%), {rate:,.0f} records/s, about {left:.0f} s left"
        )
