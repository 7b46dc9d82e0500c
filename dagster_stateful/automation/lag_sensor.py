"""The consumer-lag sensor: samples committed offsets against high watermarks, judges each partition
the way Burrow does, records lag as asset observations, and asks for a worker run when needed.

Owns the sensor factory. Its cursor keeps a window of samples per partition (`core.monitoring.lag.LagWindow`).
Bounded workers are idle between runs by design, so a partition whose offsets stand still is not
STALL or STOP unless its lag also grows. A worker run is requested when the total lag passes the
threshold and no worker run of the app is in progress; the run key is the committed offsets, so
a retry of the same tick never doubles work.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_stateful.automation.cursor import dump_cursor, load_cursor
from dagster_stateful.core.app import App
from dagster_stateful.core.monitoring.lag import LagSample, LagWindow, evaluate, evaluate_group
from dagster_stateful.naming import job_name, source_key, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator

if TYPE_CHECKING:
    from dagster_stateful.automation.worker_target import WorkerTarget


def lag_sensor(
    app: App,
    target: WorkerTarget,
    lag_threshold: int = 1000,
    window_seconds: float = 900.0,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
):
    @sensor(
        name=job_name(app, "lag_sensor"),
        job=target.job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Consumer lag of app `{app.name}` (Burrow-style status per partition); requests a worker "
        f"run when the total lag passes {lag_threshold} and none is running.",
    )
    def lag(context: SensorEvaluationContext, kafka: KafkaResource, state_store: StateStoreResource):
        bound = state_store.bind(app, kafka)
        # Samples reach back two windows so a commit older than one window can be judged STOP.
        window = LagWindow.from_json(load_cursor(context.cursor).get("window"), 2 * window_seconds)
        partitions = range(bound.kafka.partition_count(app.source) or 0)
        committed = bound.kafka.committed_offsets(app.consumer_group, app.source, partitions)
        marks = bound.kafka.watermarks(app.source, partitions)
        now = time.time()
        for partition in partitions:
            low, high = marks[partition]
            window.add(partition, LagSample(now, committed.get(partition), high, low), now)
        evaluations = {p: evaluate(window.get(p), now, window_seconds, idle_by_design=True) for p in partitions}
        group_status = evaluate_group(evaluations)
        total = sum(e.lag for e in evaluations.values())
        events = [
            AssetObservation(
                asset_key=store_key(app, store, translator),
                partition=str(p),
                metadata={
                    "lag": e.lag,
                    "status": e.status.value,
                    "reason": e.reason,
                    "committed_offset": committed.get(p) if committed.get(p) is not None else -1,
                    "high_watermark": marks[p][1],
                },
            )
            for store in app.stores
            for p, e in evaluations.items()
        ]
        events.append(
            AssetObservation(
                asset_key=source_key(app, translator),
                metadata={"consumer_group": app.consumer_group, "total_lag": total, "group_status": group_status.value},
            )
        )
        cursor = dump_cursor({"window": window.to_json()})
        if total < lag_threshold:
            return SensorResult(
                skip_reason=SkipReason(
                    f"total lag {total} is below {lag_threshold} (group status {group_status.value})"
                ),
                asset_events=events,
                cursor=cursor,
            )
        running = target.run_in_progress(context.instance)
        if running:
            return SensorResult(
                skip_reason=SkipReason(f"total lag {total}, but worker run {running.run_id} is still in progress"),
                asset_events=events,
                cursor=cursor,
            )
        run_key = "lag-" + "-".join(f"{p}:{committed.get(p)}" for p in partitions)
        return SensorResult(
            run_requests=[
                target.run_request(run_key, {"dagster-stateful/trigger": "lag", "dagster-stateful/lag": str(total)})
            ],
            asset_events=events,
            cursor=cursor,
        )

    return lag
