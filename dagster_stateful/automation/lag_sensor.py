"""The consumer-lag sensor: samples committed offsets against high watermarks, judges each partition
the way Burrow does, records lag as asset observations, and asks for a worker run when needed.

Owns the sensor factory. It watches every input of the app (`AppQueries.describe_inputs`): the
topics it consumes, its source and, when it re-keys, its repartition topic, whose partitions own the
state (records the re-keying wrote there and no worker consumed yet are work like the source's);
its partitioned tables (records not applied by the group's last commit, per table and partition);
its global tables (their size, the most a worker's start reads). What it records of them is
`lag_observations`. Its cursor keeps a window of samples per stream topic and partition
(`core.monitoring.lag.LagWindow`).
Bounded workers are idle between runs by design, so a partition whose offsets stand still is not
STALL or STOP unless its lag also grows. A worker run is requested when the total lag of the stream
inputs passes the threshold and no worker run of the app is in progress; the tables' lag is
reported, never a reason for a run on its own (a worker applies table records as the stream's
records come, so a run without stream records would apply none). The run key is the committed
offsets, so a retry of the same tick never doubles work.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dagster import (
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_stateful.automation.cursor import dump_cursor, load_cursor
from dagster_stateful.automation.lag_observations import (
    WatchedTopic,
    lag_observations,
    table_lag_tags,
    tables_summary,
)
from dagster_stateful.core.app import App
from dagster_stateful.core.monitoring.lag import LagSample, LagWindow, evaluate, evaluate_group
from dagster_stateful.core.queries.input_lag import StreamPartitionLag
from dagster_stateful.naming import job_name
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
        description=_description(app, lag_threshold),
    )
    def lag(context: SensorEvaluationContext, kafka: KafkaResource, state_store: StateStoreResource):
        described = state_store.bind(app, kafka).describe_inputs()
        saved = load_cursor(context.cursor)
        now = time.time()
        windows, watched = {}, {}
        for topic in inputs:
            # Samples reach back two windows so a commit older than one window can be judged STOP.
            window = LagWindow.from_json(saved.get(_cursor_field(app, topic)), 2 * window_seconds)
            watched[topic] = _watch(described.streams.get(topic, {}), window, now, window_seconds)
            windows[_cursor_field(app, topic)] = window.to_json()
        total = sum(watched_topic.total_lag for watched_topic in watched.values())
        events = lag_observations(app, watched, described, translator)
        cursor = dump_cursor(windows)
        tables = tables_summary(described)
        if tables:
            context.log.info("App %s: %s", app.name, tables)
        # Every partition of every stream input, numbered apart: the source's and the repartition topic's share numbers.
        group_status = evaluate_group(
            dict(enumerate(e for watched_topic in watched.values() for e in watched_topic.evaluations.values()))
        )
        if total < lag_threshold:
            return SensorResult(
                skip_reason=SkipReason(
                    f"total lag {total} is below {lag_threshold} (group status {group_status.value})"
                    + (f"; {tables}" if tables else "")
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
            f"{p}:{watched[topic].partitions[p].committed}" for topic in inputs for p in watched[topic].evaluations
        )
        tags = {"dagster-stateful/trigger": "lag", "dagster-stateful/lag": str(total), **table_lag_tags(described)}
        return SensorResult(run_requests=[target.run_request(run_key, tags)], asset_events=events, cursor=cursor)

    return lag


def _description(app: App, lag_threshold: int) -> str:
    topics = ", ".join(f"`{t}`" for t in app.config.input_topics)
    tables = [*app.config.tables, *app.config.global_tables]
    reported = f"; reports the lag of its tables {', '.join(f'`{t}`' for t in tables)}" if tables else ""
    return (
        f"Consumer lag of app `{app.name}` on {topics} (Burrow-style status per partition); requests a worker run "
        f"when the total lag passes {lag_threshold} and none is running{reported}."
    )


def _cursor_field(app: App, topic: str) -> str:
    """Where the cursor keeps a topic's window (the source's under the name it always had)."""
    return "window" if topic == app.source else f"window:{topic}"


def _watch(
    partitions: dict[int, StreamPartitionLag], window: LagWindow, now: float, window_seconds: float
) -> WatchedTopic:
    """One stream input's partitions sampled into `window`, and each one's status over it."""
    for partition, sampled in partitions.items():
        window.add(partition, LagSample(now, sampled.committed, sampled.high, sampled.low), now)
    evaluations = {p: evaluate(window.get(p), now, window_seconds, idle_by_design=True) for p in partitions}
    return WatchedTopic(partitions, evaluations)
