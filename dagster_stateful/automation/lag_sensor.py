"""The consumer-lag sensor: samples committed offsets against high watermarks, judges each partition
the way Burrow does, records lag as asset observations, and asks for a worker run when needed.

Owns the sensor factory. It watches every topic the app consumes: its source, and when it re-keys
its repartition topic, whose partitions own the state (each store partition's lag is observed on
the store asset; a topic's total on the topic's asset). Its cursor keeps a window of samples per
topic and partition (`core.monitoring.lag.LagWindow`).
Bounded workers are idle between runs by design, so a partition whose offsets stand still is not
STALL or STOP unless its lag also grows. A worker run is requested when the total lag passes the
threshold and no worker run of the app is in progress; the run key is the committed offsets, so
a retry of the same tick never doubles work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
from dagster_stateful.core.monitoring.lag import (
    LagSample,
    LagWindow,
    PartitionEvaluation,
    evaluate,
    evaluate_group,
)
from dagster_stateful.naming import job_name, source_key, state_topic_key, store_key
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
    inputs = app.config.input_topics

    @sensor(
        name=job_name(app, "lag_sensor"),
        job=target.job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Consumer lag of app `{app.name}` on {', '.join(f'`{t}`' for t in inputs)} (Burrow-style "
        f"status per partition); requests a worker run when the total lag passes {lag_threshold} and none is running.",
    )
    def lag(context: SensorEvaluationContext, kafka: KafkaResource, state_store: StateStoreResource):
        bound = state_store.bind(app, kafka)
        saved = load_cursor(context.cursor)
        now = time.time()
        windows, watched = {}, {}
        for topic in inputs:
            # Samples reach back two windows so a commit older than one window can be judged STOP.
            window = LagWindow.from_json(saved.get(_cursor_field(app, topic)), 2 * window_seconds)
            watched[topic] = _watch(bound, topic, window, now, window_seconds)
            windows[_cursor_field(app, topic)] = window.to_json()
        total = sum(e.lag for topic in inputs for e in watched[topic].evaluations.values())
        state_topic = watched[app.config.task_topic]
        events = [
            AssetObservation(
                asset_key=store_key(app, store, translator),
                partition=str(p),
                metadata={
                    "lag": e.lag,
                    "status": e.status.value,
                    "reason": e.reason,
                    "committed_offset": state_topic.committed.get(p)
                    if state_topic.committed.get(p) is not None
                    else -1,
                    "high_watermark": state_topic.marks[p][1],
                },
            )
            for store in app.stores
            for p, e in state_topic.evaluations.items()
        ]
        for topic in inputs:
            key = source_key(app, translator) if topic == app.source else state_topic_key(app, translator)
            watched_topic = watched[topic]
            events.append(
                AssetObservation(
                    asset_key=key,
                    metadata={
                        "consumer_group": app.consumer_group,
                        "total_lag": sum(e.lag for e in watched_topic.evaluations.values()),
                        "group_status": evaluate_group(watched_topic.evaluations).value,
                    },
                )
            )
        cursor = dump_cursor(windows)
        group_status = evaluate_group(
            {p: e for watched_topic in watched.values() for p, e in watched_topic.evaluations.items()}
        )
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
        run_key = "lag-" + "-".join(
            f"{p}:{watched[topic].committed.get(p)}" for topic in inputs for p in watched[topic].evaluations
        )
        return SensorResult(
            run_requests=[
                target.run_request(run_key, {"dagster-stateful/trigger": "lag", "dagster-stateful/lag": str(total)})
            ],
            asset_events=events,
            cursor=cursor,
        )

    return lag


@dataclass
class WatchedTopic:
    """One input topic at one tick: the group's committed offsets, the watermarks and each partition's status."""

    committed: dict[int, int | None]
    marks: dict[int, tuple[int, int]]
    evaluations: dict[int, PartitionEvaluation]


def _cursor_field(app: App, topic: str) -> str:
    """Where the cursor keeps a topic's window (the source's under the name it always had)."""
    return "window" if topic == app.source else f"window:{topic}"


def _watch(bound: App, topic: str, window: LagWindow, now: float, window_seconds: float) -> WatchedTopic:
    partitions = range(bound.kafka.partition_count(topic) or 0)
    committed = bound.kafka.committed_offsets(bound.consumer_group, topic, partitions)
    marks = bound.kafka.watermarks(topic, partitions)
    for partition in partitions:
        low, high = marks[partition]
        window.add(partition, LagSample(now, committed.get(partition), high, low), now)
    evaluations = {p: evaluate(window.get(p), now, window_seconds, idle_by_design=True) for p in partitions}
    return WatchedTopic(committed, marks, evaluations)
