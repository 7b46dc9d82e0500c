"""Assets of a stateful app: its source topic, its changelog topics, its state stores and snapshots.

Owns the asset builders. The source topic is an external asset (its producers write it, not
Dagster). Materializing the changelog assets provisions or validates the compacted topics.
Materializing a state store runs a bounded worker: over every partition it joins the app's consumer
group; over chosen partitions (the store is partitioned by Kafka partition) it pins a worker to
them, so one partition can be restored and brought up to date from the UI (`worker_runs` runs it
and records what it did). Materializing a
snapshot has Spark fold the changelog, up to what the consumer group committed, into the store's
next snapshot; a partitioned table's snapshot is its topic folded up to the positions the group's
commits applied it to.
"""

from collections.abc import Callable, Iterator
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    StaticPartitionsDefinition,
    multi_asset,
)
from pydantic import Field

from dagster_stateful.checks import freshness_check_spec, table_check_spec
from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.provisioning import TopicStatus
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.table_snapshots import table_snapshots
from dagster_stateful.core.state.decoding import RowDecoder
from dagster_stateful.core.state_tables.table import write_snapshot_table
from dagster_stateful.metadata import (
    changelog_states,
    snapshot_metadata,
    state_table_metadata,
    table_snapshot_metadata,
)
from dagster_stateful.naming import (
    changelog_key,
    group_name,
    job_name,
    snapshot_key,
    snapshot_tables,
    source_key,
    state_topic_key,
    store_key,
    table_snapshot_key,
    table_store_key,
    worker_pool,
)
from dagster_stateful.resources import KafkaResource, SparkRunner, StateStoreResource
from dagster_stateful.state_table import table_row_decoder
from dagster_stateful.state_table_loader import (
    APP_METADATA,
    STORE_METADATA,
    TABLE_METADATA,
    state_table_io_manager,
    state_table_io_manager_key,
)
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator
from dagster_stateful.worker_runs import WorkerConfig, run_store_worker


def kafka_partitions(count: int) -> StaticPartitionsDefinition:
    return StaticPartitionsDefinition([str(p) for p in range(count)])


def source_topic_spec(topic: str, readers: list[App], translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetSpec:
    """The asset of a topic its producers write and the apps `readers` read (one or more), as their
    source or as a global table, in a group of its own."""
    names = ", ".join(f"`{app.name}`" for app in readers)
    apps = "apps" if len(readers) > 1 else "app"
    tables = [app.name for app in readers if topic in app.config.global_tables.values()]
    as_table = f" (as a global table by {', '.join(f'`{name}`' for name in tables)})" if tables else ""
    partitioned = [app.name for app in readers if topic in app.config.tables.values()]
    if partitioned:
        as_table += f" (as a partitioned table by {', '.join(f'`{name}`' for name in partitioned)})"
    joined = [app.name for app in readers if topic in app.config.joined_streams.values()]
    if joined:
        as_table += f" (as a joined stream by {', '.join(f'`{name}`' for name in joined)})"
    return AssetSpec(
        translator.get_topic_key(topic),
        group_name=translator.get_topic_group_name(topic),
        kinds={"kafka"},
        description=f"Kafka topic `{topic}`, written by its producers; read by {apps} {names}{as_table}.",
        metadata={"topic": topic, "consumer_groups": ", ".join(app.consumer_group for app in readers)},
    )


def table_keys(app: App, before_rekeying: bool, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> list[AssetKey]:
    """The topics of the tables (global or partitioned) the app's steps join with: upstream of its
    stores, or of its repartition topic for those joined before `group_by` (`before_rekeying`)."""
    config = app.config
    tables = {**config.global_tables, **config.tables}
    topics = dict.fromkeys(
        topic for name, topic in tables.items() if config.joined_before_rekeying(name) == before_rekeying
    )
    if not before_rekeying:
        topics.update(dict.fromkeys(config.joined_streams.values()))
    return [translator.get_topic_key(topic) for topic in topics]


def repartition_specs(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> list[AssetSpec]:
    """The repartition topic of an app that re-keys: written from its source, read by its stores' steps."""
    topic, repartition = app.config.repartition_topic, app.config.repartition
    if topic is None or repartition is None:
        return []
    return [
        AssetSpec(
            translator.get_repartition_key(app),
            deps=[source_key(app, translator), *table_keys(app, True, translator)],
            group_name=group_name(app, translator),
            kinds={"kafka"},
            skippable=True,
            description=f"Repartition topic `{topic}`: the source's records re-keyed by `group_by` "
            f"{repartition.name!r}, read back by the steps after it; purged once consumed and committed.",
            metadata={"topic": topic},
        )
    ]


def changelog_assets(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    stores = app.stores if app.config.use_changelog_topics else ()
    specs = repartition_specs(app, translator) + [
        AssetSpec(
            changelog_key(app, store, translator),
            deps=[state_topic_key(app, translator)],
            group_name=group_name(app, translator),
            kinds={"kafka"},
            skippable=True,
            description=f"Compacted changelog of store `{store}`: every state change, the source of "
            "truth for restoring the store.",
        )
        for store in stores
    ]

    @multi_asset(name=job_name(app, "changelogs"), specs=specs, can_subset=False)
    def changelogs(
        context: AssetExecutionContext, kafka: KafkaResource, state_store: StateStoreResource
    ) -> Iterator[MaterializeResult]:
        """Provision the changelogs (and the repartition topic). A topic is materialized when
        provisioning created it (or it has no materialization yet); one that was there already is
        observed, so its stores, which depend on it, are not shown as unsynced by a provisioning
        that changed nothing."""
        bound = state_store.bind(app, kafka)
        plan = bound.provision()
        context.log.info("Provisioning plan for %s:\n%s", app.name, plan.describe())
        for key, metadata in changelog_states(app, bound, plan, translator):
            created = metadata["status"] == TopicStatus.CREATED.value
            if created or context.instance.get_latest_materialization_event(key) is None:
                yield MaterializeResult(asset_key=key, metadata=metadata)
            else:
                context.log_event(AssetObservation(asset_key=key, metadata=metadata))

    return changelogs


def store_assets(
    app: App,
    source_partitions: int,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
    max_changelog_lag: int = 100_000,
    pool_size: int = 1,
):
    """The state stores of `app`, partitioned by Kafka partition; each materialization runs a bounded
    worker and carries the stores' freshness check, evaluated after it. With `pool_size` > 1 the
    schedule and the lag sensor run the pool job instead, which each store's description says."""
    partitions_def = kafka_partitions(source_partitions)
    pool_note = (
        f" Its worker schedule and lag sensor launch the job `{job_name(app, 'worker')}` instead: a pool of "
        f"{pool_size} workers per run."
        if pool_size > 1
        else ""
    )
    specs = [
        AssetSpec(
            store_key(app, store, translator),
            deps=[
                changelog_key(app, store, translator)
                if app.config.use_changelog_topics
                else state_topic_key(app, translator),
                *table_keys(app, False, translator),
            ],
            group_name=group_name(app, translator),
            kinds={"rocksdb" if app.store_profile(store)["kind"] == "rocksdb" else "python"},
            partitions_def=partitions_def,
            skippable=True,
            description=f"State store `{store}` of app `{app.name}` ({app.store_profile(store)['kind']}), one "
            "database per Kafka partition. Materializing runs a bounded worker on the chosen partitions." + pool_note,
            metadata={f"store_{name}": value for name, value in app.store_profile(store).items()},
        )
        for store in app.stores
    ] + [
        AssetSpec(
            table_store_key(app, table, translator),
            deps=[translator.get_topic_key(topic)],
            group_name=group_name(app, translator),
            kinds={"rocksdb"},
            partitions_def=partitions_def,
            skippable=True,
            description=f"Partitioned table `{table}` of app `{app.name}`, from the compacted topic `{topic}` (its "
            "changelog): one database per Kafka partition, beside the task's stores, applied as far as the "
            "task's commits say. Materialized by the worker runs of the app's stores.",
            metadata={"table_topic": topic},
        )
        for table, topic in app.config.tables.items()
    ]
    checks = [freshness_check_spec(app, store, max_changelog_lag, translator) for store in app.stores]
    checks += [table_check_spec(app, table, translator) for table in app.config.tables]

    @multi_asset(
        name=job_name(app, "stores"),
        specs=specs,
        check_specs=checks,
        can_subset=False,
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        pool=worker_pool(app),
    )
    def stores(
        context: AssetExecutionContext, config: WorkerConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        bound = state_store.bind(app, kafka)
        yield from run_store_worker(context, app, bound, config, source_partitions, translator, max_changelog_lag)

    return stores


class SnapshotConfig(Config):
    keep: int = Field(default=3, description="Snapshots kept per store; older ones are deleted.")


def snapshot_assets(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    """The snapshot assets of `app`: one per store (with changelog topics), downstream of its
    changelog, and one per partitioned table (but a versioned one), downstream of the table's topic,
    its changelog; materialized together, by Spark."""
    stores = app.stores if app.config.use_changelog_topics else []
    specs = [
        AssetSpec(
            snapshot_key(app, store, translator),
            deps=[changelog_key(app, store, translator)],
            group_name=group_name(app, translator),
            kinds={"spark", "parquet"},
            description=f"Compacted snapshot of store `{store}`'s changelog (Parquet per Kafka partition, "
            "keys sorted), built by Spark; bulk restores load it and replay only the tail. Its decoded table "
            "(one row per state value) is written beside it, and an asset taking this one as an input receives it.",
            metadata={APP_METADATA: app.name, STORE_METADATA: store},
        ).with_io_manager_key(state_table_io_manager_key(app))
        for store in stores
    ] + [
        AssetSpec(
            table_snapshot_key(app, table, translator),
            deps=[translator.get_topic_key(app.config.tables[table])],
            group_name=group_name(app, translator),
            kinds={"spark", "parquet"},
            description=f"Compacted snapshot of partitioned table `{table}` (from its topic "
            f"`{app.config.tables[table]}`, up to the positions the app's commits applied it to; Parquet per Kafka "
            "partition, keys sorted), built by Spark; `App.restore_table_partitions` loads it. Its decoded table "
            "(one row per key) is written beside it, and an asset taking this one as an input receives it.",
            metadata={APP_METADATA: app.name, TABLE_METADATA: table},
        ).with_io_manager_key(state_table_io_manager_key(app))
        for table in snapshot_tables(app)
    ]

    # The assets carry the IO manager that hands them to downstream assets, so no caller supplies it;
    # Dagster then takes the other resources by key only, not as arguments.
    @multi_asset(
        name=job_name(app, "snapshots"),
        specs=specs,
        can_subset=False,
        required_resource_keys={"kafka", "state_store", "spark"},
        resource_defs={state_table_io_manager_key(app): state_table_io_manager(app)},
    )
    def snapshots(context: AssetExecutionContext, config: SnapshotConfig) -> Iterator[MaterializeResult]:
        kafka: KafkaResource = context.resources.kafka
        state_store: StateStoreResource = context.resources.state_store
        spark: SparkRunner = context.resources.spark
        root = state_store.snapshot_root
        if not root:
            raise Failure(
                description="Snapshots need a location: set `snapshot_root` on the state_store resource "
                "(a path or a URI Spark can write)."
            )
        for store in stores:
            key = snapshot_key(app, store, translator)
            snapshot_store = SnapshotStore(root, app.name, store)
            manifest = spark.take_snapshot(context.op_execution_context, kafka, app, snapshot_store, config.keep, key)
            metadata = _with_table(manifest, snapshot_store, app.row_decoder(store), snapshot_metadata)
            if metadata["partitions_cut_short"]:
                context.log.info(
                    "Snapshot of %s stops short of the changelog's end in %d partition(s) (records of uncommitted "
                    "messages); restores replay those records from the changelog",
                    store,
                    metadata["partitions_cut_short"],
                )
            yield MaterializeResult(asset_key=key, metadata=metadata)
        for table in snapshot_tables(app):
            key = table_snapshot_key(app, table, translator)
            snapshot_store = table_snapshots(root, app.name, table)
            manifest = spark.take_table_snapshot(
                context.op_execution_context, kafka, app, snapshot_store, config.keep, key
            )
            metadata = _with_table(manifest, snapshot_store, table_row_decoder(app, table), table_snapshot_metadata)
            yield MaterializeResult(asset_key=key, metadata=metadata)

    return snapshots


def _with_table(
    manifest: SnapshotManifest,
    snapshots: SnapshotStore,
    decoder: RowDecoder,
    described: Callable[[SnapshotManifest, str], dict[str, Any]],
) -> dict[str, Any]:
    """A snapshot's metadata (`described`), its decoded table written beside it and described too."""
    metadata = described(manifest, snapshots.snapshot_location(manifest.snapshot_id))
    table = write_snapshot_table(decoder, snapshots, manifest)
    return metadata | state_table_metadata(table, snapshots.table_location(manifest.snapshot_id))
