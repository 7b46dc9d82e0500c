"""A bounded worker run from Dagster, and what Dagster records of it.

Owns `WorkerConfig` (a run's limits) and the one way the Dagster layer runs a worker and turns its
report into materializations, asset check results and metadata, for the two places that run one:
the store assets (`run_store_worker`: the chosen partitions, or all of them in the consumer group;
one materialization per store, with the run's figures) and the worker job's steps
(`run_worker_step`: one worker or pool member in the consumer group; one materialization per store
partition it changed, the run's figures as the step's output metadata). Either way, the run's
restores show in the run's log as they advance, a run that changed nothing records no
materialization, a changelog the worker created gets its first materialization, and each store's
freshness check (`checks.freshness_check_spec`) gets its verdict from the run.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    Config,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
)
from pydantic import Field

from dagster_stateful.checks import FRESHNESS_CHECK, TABLE_POSITION_CHECK, freshness_verdict, table_verdict
from dagster_stateful.core.app import App
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.queries.describe import PartitionDescription
from dagster_stateful.metadata import (
    changelog_states,
    commit_metadata,
    copies_metadata,
    partition_metadata,
    partitions_metadata,
    store_run_metadata,
    worker_metadata,
)
from dagster_stateful.naming import internal_topic_keys, store_key, table_store_key
from dagster_stateful.run_progress import RestoreProgressLog
from dagster_stateful.state_rows import state_sample
from dagster_stateful.translator import StatefulTranslator

RunContext = AssetExecutionContext | OpExecutionContext


class WorkerConfig(Config):
    """Limits of one bounded worker run; it stops at the first one reached."""

    max_messages: int | None = Field(default=None, description="Stop after this many messages (none: no limit).")
    max_seconds: float = Field(default=120.0, description="Stop after this many seconds.")
    until_caught_up: bool = Field(default=True, description="Stop once every assigned partition is at its end.")


@dataclass(frozen=True)
class _WorkerRun:
    """A finished run of a worker of `app` (`bound`: the app bound to the run's resources)."""

    app: App
    bound: App
    report: WorkerReport
    translator: StatefulTranslator
    max_changelog_lag: int

    def key(self, store: str) -> AssetKey:
        return store_key(self.app, store, self.translator)

    def freshness(self) -> Iterator[tuple[str, AssetKey, dict[str, Any]]]:
        """Per store: its name, its asset key and its freshness check's verdict after the run."""
        for store in self.app.stores:
            yield store, self.key(store), freshness_verdict(self.bound, store, self.max_changelog_lag)

    def sample(self, store: str, partitions: list[int]) -> MetadataValue:
        return MetadataValue.json(state_sample(self.bound, store, partitions))


def run_store_worker(
    context: AssetExecutionContext,
    app: App,
    bound: App,
    config: WorkerConfig,
    source_partitions: int,
    translator: StatefulTranslator,
    max_changelog_lag: int,
) -> Iterator[MaterializeResult | AssetCheckResult]:
    """The store assets' run: a worker pinned to the run's partitions (or, over every partition,
    one joining the consumer group); per store, a materialization when the run changed something
    (the run's figures, the store's metrics and its partitions' state) and its freshness result."""
    chosen = sorted(int(key) for key in context.partition_keys)
    pinned = None if len(chosen) == source_partitions else chosen
    context.log.info(
        "Running a bounded worker of %s on %s",
        app.name,
        f"partitions {pinned}" if pinned else "every partition (joining the consumer group)",
    )
    run = _run(context, app, bound, config, pinned, translator, max_changelog_lag)
    report = run.report
    changed = bool(report.total_processed or report.restores or report.committed_offsets)
    if not changed:
        _nothing_to_do(context, f"partitions {chosen}" if pinned else "any partition")
    descriptions = bound.describe_partitions(chosen) if changed else []
    _first_changelog_records(context, run)
    for store, key, verdict in run.freshness():
        if changed:
            yield MaterializeResult(
                asset_key=key,
                metadata={
                    **worker_metadata(report, store_totals=False),
                    **store_run_metadata(report, store),
                    **partitions_metadata(d for d in descriptions if d.store == store),
                    "state_sample": run.sample(store, chosen),
                },
            )
        yield AssetCheckResult(asset_key=key, check_name=FRESHNESS_CHECK, **verdict)
    yield from _table_results(run, chosen, changed)


def _table_results(
    run: _WorkerRun, partitions: list[int], changed: bool
) -> Iterator[MaterializeResult | AssetCheckResult]:
    """Per partitioned table: a materialization when the run changed something (where the commits
    applied it, per partition), and its check's verdict."""
    descriptions = run.bound.describe_tables(partitions) if run.app.config.tables else []
    for table in run.app.config.tables:
        key = table_store_key(run.app, table, run.translator)
        mine = [d for d in descriptions if d.table == table]
        if changed:
            yield MaterializeResult(
                asset_key=key,
                metadata={
                    "table_records_applied": run.report.table_records_applied,
                    "records_not_applied": sum(d.records_not_applied for d in mine),
                    "table_partitions": MetadataValue.json([d.to_dict() for d in mine]),
                },
            )
        yield AssetCheckResult(asset_key=key, check_name=TABLE_POSITION_CHECK, **table_verdict(mine))


def run_worker_step(
    context: OpExecutionContext,
    app: App,
    bound: App,
    config: WorkerConfig,
    translator: StatefulTranslator,
    max_changelog_lag: int,
) -> None:
    """A worker job step's run in the consumer group (`bound` may be a pool member): a
    materialization per store partition it changed (it processed messages or restored state
    there), the stores' freshness evaluations, and the run's figures as the step's metadata."""
    run = _run(context, app, bound, config, None, translator, max_changelog_lag)
    report = run.report
    processed = {p for p, count in report.messages_processed.items() if count}
    touched = sorted(processed | {r.partition for r in report.restores})
    if not touched:
        _nothing_to_do(context, "any partition")
        return
    for description in bound.describe_partitions(touched):
        context.log_event(_partition_materialization(run, description))
    _first_changelog_records(context, run)
    for _, key, verdict in run.freshness():
        # log_event takes an AssetCheckEvaluation (dagster 1.13 handles it); its annotation does not say so.
        context.log_event(AssetCheckEvaluation(asset_key=key, check_name=FRESHNESS_CHECK, **verdict))  # type: ignore[arg-type]
    _log_table_partitions(context, run, touched)
    context.add_output_metadata(worker_metadata(report))


def _log_table_partitions(context: OpExecutionContext, run: _WorkerRun, partitions: list[int]) -> None:
    """A worker step's partitioned tables: a materialization per table partition of the partitions
    it changed (for a table joined before `group_by`, the source partitions it re-keyed), and each
    table's check."""
    config = run.app.config
    if not config.tables:
        return
    rekeyed = sorted(p for p, count in run.report.rekeyed.items() if count)
    repartition = config.repartition
    if repartition is not None and repartition.partitions is not None:
        # The table assets are partitioned as the stores: source partitions past that count have no asset partition.
        rekeyed = [p for p in rekeyed if p < repartition.partitions]
    held = {
        table: rekeyed if config.table_stream_topic(table) != config.task_topic else partitions
        for table in config.tables
    }
    wanted = sorted(set(partitions) | set(rekeyed))
    descriptions = [d for d in run.bound.describe_tables(wanted) if d.partition in held[d.table]]
    for description in descriptions:
        key = table_store_key(run.app, description.table, run.translator)
        context.log_event(
            AssetMaterialization(asset_key=key, partition=str(description.partition), metadata=description.to_dict())
        )
    for table in run.app.config.tables:
        key = table_store_key(run.app, table, run.translator)
        verdict = table_verdict([d for d in descriptions if d.table == table])
        context.log_event(AssetCheckEvaluation(asset_key=key, check_name=TABLE_POSITION_CHECK, **verdict))  # type: ignore[arg-type]


def _run(
    context: RunContext,
    app: App,
    bound: App,
    config: WorkerConfig,
    partitions: list[int] | None,
    translator: StatefulTranslator,
    max_changelog_lag: int,
) -> _WorkerRun:
    """Runs the worker within `config`'s limits (pinned to `partitions`, or in the consumer group),
    its restores' progress in the run's log."""
    bound.add_restore_listener(RestoreProgressLog(context.log))
    report = bound.run_worker(config.max_messages, config.max_seconds, config.until_caught_up, partitions)
    return _WorkerRun(app, bound, report, translator, max_changelog_lag)


def _nothing_to_do(context: RunContext, where: str) -> None:
    context.log.info(
        "Nothing to do: no message to process and no state to restore on %s; no materialization is recorded", where
    )


def _partition_materialization(run: _WorkerRun, description: PartitionDescription) -> AssetMaterialization:
    """One store partition the run changed: its state and offsets, its copies, the run's work on it."""
    report, partition = run.report, description.partition
    return AssetMaterialization(
        asset_key=run.key(description.store),
        partition=str(partition),
        description=f"worker run: {report.messages_processed.get(partition, 0)} messages",
        metadata={
            **partition_metadata(description),
            **copies_metadata(run.bound, report, description),
            "messages_processed": report.messages_processed.get(partition, 0),
            **store_run_metadata(report, description.store, partition),
            **commit_metadata(report.commit_latency),
            "state_sample": run.sample(description.store, [partition]),
        },
    )


def _first_changelog_records(context: RunContext, run: _WorkerRun) -> None:
    """A materialization of each changelog the instance has none of yet. Workers create their
    changelogs themselves, so without this a changelog a worker writes would show "never
    materialized" until someone ran the provision job."""
    app, bound = run.app, run.bound
    keys = internal_topic_keys(app, run.translator)
    if not keys:
        return
    if all(context.instance.get_latest_materialization_event(key) is not None for key in keys):
        return
    for key, metadata in changelog_states(app, bound, bound.provisioning_plan(), run.translator):
        if context.instance.get_latest_materialization_event(key) is None:
            description = "first recorded after a worker run, which provisions its changelogs"
            context.log_event(AssetMaterialization(asset_key=key, description=description, metadata=metadata))
