"""What the lag sensor records of an app's inputs: asset observations, run tags and a summary in words.

Owns `WatchedTopic` (one stream input at one tick: each partition's lag and Burrow status) and the
observations made of it and of the tables: per partition of the state's topic on each store asset
(`lag`, `status`, `reason`, `committed_offset`, `high_watermark`); per stream topic on its asset
(`total_lag`, `group_status`); per partitioned table and partition on the table's asset
(`records_not_applied` by the group's last commit, `committed_position`, `topic_end`); per global
table on its topic's asset (`records_read_at_start_at_most`, `end_offsets`). Only stream lag is work
a worker run owes: table records are applied as the task's records come, so their lag is reported,
in the observations, the run tags and the skip reason, and never requests a run by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster import AssetObservation, MetadataValue

from dagster_stateful.core.app import App
from dagster_stateful.core.monitoring.lag import PartitionEvaluation, evaluate_group
from dagster_stateful.core.queries.input_lag import GlobalTableSize, InputsLag, StreamPartitionLag
from dagster_stateful.core.queries.tables import TablePartitionDescription
from dagster_stateful.naming import source_key, state_topic_key, store_key, table_store_key
from dagster_stateful.translator import StatefulTranslator

TABLE_LAG_TAG = "dagster-stateful/table_lag"
"""Run tag: records not applied per partitioned table, as `name=count` pairs (reported, not the run's trigger)."""


@dataclass
class WatchedTopic:
    """One stream input at one tick: each partition's lag, and its status over the sensor's window."""

    partitions: dict[int, StreamPartitionLag]
    evaluations: dict[int, PartitionEvaluation]

    @property
    def total_lag(self) -> int:
        return sum(e.lag for e in self.evaluations.values())


def lag_observations(
    app: App, watched: dict[str, WatchedTopic], inputs: InputsLag, translator: StatefulTranslator
) -> list[AssetObservation]:
    """Every observation of one tick: stores, stream topics, partitioned tables, global tables."""
    return [
        *store_observations(app, watched[app.config.task_topic], translator),
        *topic_observations(app, watched, translator),
        *(table_observation(app, description, translator) for description in inputs.tables),
        *(global_table_observation(app, size, translator) for size in inputs.global_tables),
    ]


def store_observations(app: App, state_topic: WatchedTopic, translator: StatefulTranslator) -> list[AssetObservation]:
    """Per store and partition of the topic that owns the state: its lag and status."""
    return [
        AssetObservation(
            asset_key=store_key(app, store, translator),
            partition=str(p),
            metadata={
                "lag": e.lag,
                "status": e.status.value,
                "reason": e.reason,
                "committed_offset": _or_minus_one(state_topic.partitions[p].committed),
                "high_watermark": state_topic.partitions[p].high,
            },
        )
        for store in app.stores
        for p, e in state_topic.evaluations.items()
    ]


def topic_observations(
    app: App, watched: dict[str, WatchedTopic], translator: StatefulTranslator
) -> list[AssetObservation]:
    """Per stream input (the source, the repartition topic): the group's total lag and status on it."""
    return [
        AssetObservation(
            asset_key=source_key(app, translator) if topic == app.source else state_topic_key(app, translator),
            metadata={
                "consumer_group": app.consumer_group,
                "total_lag": watched_topic.total_lag,
                "group_status": evaluate_group(watched_topic.evaluations).value,
            },
        )
        for topic, watched_topic in watched.items()
    ]


def table_observation(
    app: App, description: TablePartitionDescription, translator: StatefulTranslator
) -> AssetObservation:
    """One partitioned table's partition: the records the group's last commit had not applied."""
    return AssetObservation(
        asset_key=table_store_key(app, description.table, translator),
        partition=str(description.partition),
        metadata={
            "records_not_applied": description.records_not_applied,
            "committed_position": _or_minus_one(description.committed_position),
            "topic_end": description.topic_end,
            "table_topic": description.topic,
            "position_valid": description.position_valid,
        },
    )


def global_table_observation(app: App, size: GlobalTableSize, translator: StatefulTranslator) -> AssetObservation:
    """A global table's topic: how much a worker's next start reads at most (no position is committed)."""
    return AssetObservation(
        asset_key=translator.get_topic_key(size.topic),
        metadata={
            "global_table": size.table,
            "read_by_app": app.name,
            "records_read_at_start_at_most": size.records_at_most,
            "end_offsets": MetadataValue.json({str(p): end for p, end in sorted(size.ends.items())}),
        },
    )


def table_lag_tags(inputs: InputsLag) -> dict[str, str]:
    """The run tag of the partitioned tables' lag (none when the app has no partitioned table)."""
    totals = inputs.table_lag()
    return {TABLE_LAG_TAG: ",".join(f"{name}={count}" for name, count in totals.items())} if totals else {}


def tables_summary(inputs: InputsLag) -> str:
    """The tables' lag in words, for the sensor's skip reason and log ("" without tables)."""
    parts = []
    totals = inputs.table_lag()
    if totals:
        counts = ", ".join(f"{name} {count}" for name, count in totals.items())
        parts.append(f"partitioned tables' records not applied (applied as stream records come): {counts}")
    if inputs.global_tables:
        sizes = ", ".join(f"{size.table} {size.records_at_most}" for size in inputs.global_tables)
        parts.append(f"global tables' records read at the next start, at most: {sizes}")
    return "; ".join(parts)


def _or_minus_one(offset: int | None) -> int:
    return -1 if offset is None else offset
