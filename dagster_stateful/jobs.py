"""Jobs an operator launches from the Dagster UI for a stateful app, each with typed run config.

Owns the provision job (materializes the changelog assets), the worker job (one bounded worker in
the app's consumer group, or a pool of them, each recording a materialization of every store
partition it touched: `worker_runs`), the compaction job (materializes the snapshot assets), the
restore jobs (bring chosen partitions up to date by the planner's path: changelog replay or local
snapshot load, or with Spark writing the SST files), the query-state job (a store's state on this
machine, read without a lock, in the run's metadata) and the clear-state job (delete local state;
refused without `confirm` and while a worker runs).
"""

from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    define_asset_job,
    job,
    multiprocess_executor,
    op,
)
from pydantic import Field

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.partitioner import Partitioner
from dagster_stateful.core.recovery.offline_restore import PartitionRestore
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.metadata import partition_metadata, restore_metadata
from dagster_stateful.naming import internal_topic_keys, job_name, snapshot_keys, store_key, worker_pool
from dagster_stateful.resources import KafkaResource, SparkRunner, StateStoreResource
from dagster_stateful.run_progress import RestoreProgressLog
from dagster_stateful.state_rows import copy_summary, key_read_rows, state_rows
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator
from dagster_stateful.worker_runs import WorkerConfig, run_worker_step


class RestoreConfig(Config):
    partitions: list[int] = Field(description="Kafka partitions to restore, e.g. [0, 3].")
    from_scratch: bool = Field(default=False, description="Delete local state first and replay the whole changelog.")
    skip_locked: bool = Field(
        default=True, description="Skip partitions a running worker holds (it restores them itself) instead of failing."
    )
    method: str = Field(default="auto", description="auto (the planner picks), changelog or snapshot.")
    load_processes: int = Field(
        default=0,
        description=(
            "Processes loading partitions at once, from a local snapshot or by replaying the whole changelog "
            "of partitions with no local state (0: one per core)."
        ),
    )


class QueryStateConfig(Config):
    store: str = Field(description="The store to read.")
    key: str | None = Field(default=None, description="A message key (as text); empty reads every key.")
    state_key: str | None = Field(default=None, description="One state key of the message key; empty reads all.")
    partitions: list[int] = Field(default_factory=list, description="Kafka partitions to read; empty reads all.")
    limit: int = Field(default=100, description="Rows to show at most.")
    partitioner: str = Field(
        default="murmur2",
        description="How the producers place keys (murmur2: Java clients; consistent: librdkafka's default): with "
        "standby replicas, a key's partition is read from its freshest copy on this machine.",
    )


class ClearStateConfig(Config):
    partitions: list[int] = Field(default_factory=list, description="Partitions to clear; empty clears all.")
    confirm: bool = Field(
        default=False,
        description="Must be true: local state is deleted (it is restored from the changelog on the next run).",
    )


def provision_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    return define_asset_job(
        job_name(app, "provision"),
        selection=AssetSelection.assets(*internal_topic_keys(app, translator)),
        description=f"Create or validate the internal topics of app `{app.name}` (changelogs, repartition topic).",
    )


def compaction_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    return define_asset_job(
        job_name(app, "compaction"),
        selection=AssetSelection.assets(*snapshot_keys(app, translator)),
        description=f"Spark folds the changelogs of `{app.name}` (its stores' and its partitioned tables' topics) "
        "into new snapshots.",
    )


def worker_job(
    app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR, pool_size: int = 1, max_changelog_lag: int = 100_000
):
    """One bounded worker, or with `pool_size` > 1 a pool of them in one run: one op per member,
    run in parallel processes, each with its member's identity (`App.pool_member`). Each run
    records what it changed in the stores, with their freshness check (`max_changelog_lag`)."""
    if pool_size < 1:
        raise ConfigurationError(f"a worker pool has at least one member, got pool_size={pool_size}")
    if pool_size > 1:
        return _pool_job(app, translator, pool_size, max_changelog_lag)
    run_worker_op = _worker_op(app, translator, None, max_changelog_lag)

    @job(
        name=job_name(app, "worker"),
        description=f"Run one bounded worker of app `{app.name}` in its consumer "
        "group: process until caught up or a limit, commit, stop.",
    )
    def worker():
        run_worker_op()

    return worker


def _pool_job(app: App, translator: StatefulTranslator, pool_size: int, max_changelog_lag: int):
    member_ops = [_worker_op(app, translator, index, max_changelog_lag) for index in range(pool_size)]

    @job(
        name=job_name(app, "worker"),
        description=f"Run a pool of {pool_size} bounded workers of app `{app.name}` at once, in parallel processes "
        "sharing this machine's state directory, each with its own static membership: the group splits the "
        "partitions between them.",
        executor_def=multiprocess_executor.configured({"max_concurrent": pool_size}),
    )
    def worker_pool():
        for member_op in member_ops:
            member_op()

    return worker_pool


def _worker_op(app: App, translator: StatefulTranslator, member: int | None, max_changelog_lag: int):
    name = job_name(app, "run_worker_op" if member is None else f"run_worker_member_{member}_op")

    @op(name=name, pool=worker_pool(app, member))
    def run_worker_op(
        context: OpExecutionContext, config: WorkerConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> None:
        bound = state_store.bind(app, kafka)
        if member is not None:
            bound = bound.pool_member(member)
            context.log.info(f"Pool member {member}: static membership id {bound.config.group_instance_id}")
        run_worker_step(context, app, bound, config, translator, max_changelog_lag)

    return run_worker_op


def restore_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    @op(name=job_name(app, "restore_op"))
    def restore_op(
        context: OpExecutionContext, config: RestoreConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> None:
        bound = state_store.bind(app, kafka)
        bound.add_restore_listener(RestoreProgressLog(context.log))
        results = bound.restore_partitions(
            config.partitions,
            from_scratch=config.from_scratch,
            skip_locked=config.skip_locked,
            snapshot_root=state_store.snapshot_root,
            method=config.method,
            load_processes=config.load_processes or None,
        )
        _record_restores(context, app, bound, config.partitions, results, translator)

    @job(
        name=job_name(app, "restore"),
        description=f"Restore chosen partitions of app `{app.name}`: the planner "
        "replays the changelog or loads the latest snapshot and replays "
        "the tail (the rebalance sensor requests this too).",
    )
    def restore():
        restore_op()

    return restore


def spark_restore_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    @op(name=job_name(app, "spark_restore_op"))
    def spark_restore_op(
        context: OpExecutionContext,
        config: RestoreConfig,
        kafka: KafkaResource,
        state_store: StateStoreResource,
        spark: SparkRunner,
    ) -> None:
        bound = state_store.bind(app, kafka)
        bound.add_restore_listener(RestoreProgressLog(context.log))
        results = bound.restore_partitions(
            config.partitions,
            from_scratch=config.from_scratch,
            skip_locked=config.skip_locked,
            snapshot_root=state_store.snapshot_root,
            method=config.method,
            spark_cores=spark.restore_cores(),
            sst_writer=spark.sst_writer(context),
        )
        _record_restores(context, app, bound, config.partitions, results, translator)

    @job(
        name=job_name(app, "spark_restore"),
        description=f"Bulk restore of app `{app.name}` with Spark: SST files "
        "written by Spark tasks from the latest snapshot, for "
        "state too large for one process.",
    )
    def spark_restore():
        spark_restore_op()

    return spark_restore


def _record_restores(
    context: OpExecutionContext,
    app: App,
    bound: App,
    partitions: list[int],
    results: list[PartitionRestore],
    translator: StatefulTranslator,
) -> None:
    for description in bound.describe_partitions(partitions):
        mine = [r for r in results if r.partition == description.partition and r.store == description.store]
        reports = [report for result in mine for report in result.reports]
        context.log_event(
            AssetMaterialization(
                asset_key=store_key(app, description.store, translator),
                partition=str(description.partition),
                description="restore: " + "; ".join(f"{r.plan.path}: {r.plan.reason}" for r in mine),
                metadata={
                    **partition_metadata(description),
                    **restore_metadata(reports),
                    "restore_path": ", ".join(r.plan.path for r in mine),
                    "restore_reason": "; ".join(r.plan.reason for r in mine),
                },
            )
        )
    context.add_output_metadata(
        {
            **restore_metadata([report for result in results for report in result.reports]),
            "paths": MetadataValue.json({f"{r.store}/{r.partition}": r.plan.path for r in results}),
        }
    )


def query_state_job(app: App):
    @op(name=job_name(app, "query_state_op"))
    def query_state_op(
        context: OpExecutionContext, config: QueryStateConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> None:
        bound = state_store.bind(app, kafka)
        if config.store not in app.stores:
            raise Failure(description=f"App {app.name!r} has no store {config.store!r}; its stores are {app.stores}.")
        if config.key is not None and not config.partitions and app.config.num_standby_replicas:
            _query_freshest_copy(context, bound, config)
            return
        rows = state_rows(
            bound, config.store, config.partitions or None, config.key, config.state_key, max(config.limit, 1)
        )
        read = config.partitions or bound.state.local_partitions(config.store)
        context.log.info("Read %d rows of store %s (partitions %s)", len(rows), config.store, read)
        context.add_output_metadata(
            {"rows": len(rows), "partitions_read": MetadataValue.json(read), "state": MetadataValue.json(rows)}
        )

    @job(
        name=job_name(app, "query_state"),
        description=f"Read the state of a store of app `{app.name}` on this machine (one message key, or all), "
        "without taking any lock: a running worker's, a stopped one's, or the warm copies kept here (with standby "
        "replicas, one key from the freshest copy of its partition, saying which copy answered).",
    )
    def query_state():
        query_state_op()

    return query_state


def _query_freshest_copy(context: OpExecutionContext, bound: App, config: QueryStateConfig) -> None:
    """One key of an app with standby replicas, read from the freshest copy of its partition here."""
    if config.partitioner not in ("murmur2", "consistent"):
        raise Failure(description=f"partitioner is murmur2 or consistent, got {config.partitioner!r}.")
    partitioner: Partitioner = "murmur2" if config.partitioner == "murmur2" else "consistent"
    read = bound.read_key(config.store, config.key, partitioner)
    rows = key_read_rows(read, config.state_key, max(config.limit, 1))
    context.log.info("Read %d rows: %s", len(rows), read.describe())
    context.add_output_metadata(
        {
            "rows": len(rows),
            "partitions_read": MetadataValue.json([read.location.partition]),
            "answered_by": MetadataValue.json(copy_summary(read.answered_by)),
            "copies": MetadataValue.json([copy_summary(copy) for copy in read.copies]),
            "state": MetadataValue.json(rows),
        }
    )


def clear_state_job(app: App):
    @op(name=job_name(app, "clear_state_op"))
    def clear_state_op(
        context: OpExecutionContext, config: ClearStateConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> None:
        if not config.confirm:
            raise Failure(
                description=f"Refusing to delete the local state of app {app.name!r}: set `confirm: true` "
                "in the run config. The state is rebuilt from the changelog on the next run."
            )
        bound = state_store.bind(app, kafka)
        deleted = bound.clear_state(partitions=config.partitions or None)
        context.log.warning("Deleted local state of %s: %s", app.name, [str(path) for path in deleted])
        context.add_output_metadata({"deleted_paths": [str(path) for path in deleted]})

    @job(
        name=job_name(app, "clear_state"),
        description=f"Delete local state of app `{app.name}` (all, or chosen "
        "partitions). Refused while a worker of the app runs.",
    )
    def clear_state():
        clear_state_op()

    return clear_state
