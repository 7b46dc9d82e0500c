"""Jobs that write a store's state from a table, launched from the Dagster UI: bootstrap and migration.

Owns the bootstrap-state job (a Parquet table made a store's state, with the source positions
processing starts from; `state_table.bootstrap_store`) and the transform-state job (the latest
snapshot reshaped by a transformation importable in the code location, `module:function`;
`state_table.transform_state`). Both rewrite a store's state for every machine, so both are
refused without `confirm: true`, and both record the snapshot they publish as a materialization
of the store's snapshot asset, with its decoded table's preview.
"""

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.parquet as pq
from dagster import AssetMaterialization, Config, Failure, OpExecutionContext, job, op
from pydantic import Field

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.partitioner import PARTITIONERS
from dagster_stateful.core.state_tables.bootstrap import SourcePositions
from dagster_stateful.core.state_tables.table import read_snapshot_table
from dagster_stateful.metadata import snapshot_metadata, state_table_metadata
from dagster_stateful.naming import job_name, snapshot_key
from dagster_stateful.resources import KafkaResource, SparkRunner, StatefulSparkResource, StateStoreResource
from dagster_stateful.state_table import ENGINES, bootstrap_store, snapshot_of, transform_state
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator

__all__ = ["bootstrap_state_job", "transform_state_job"]

T = TypeVar("T")
CONFIRM = "Must be true: the store's state is replaced for every machine that restores it."


class BootstrapStateConfig(Config):
    store: str = Field(description="The store to bootstrap.")
    table_path: str = Field(
        description="A Parquet file or directory (a path or URI pyarrow reads) with columns key, state_key and "
        "value (or one column per value field), and optionally partition."
    )
    source_offsets: dict[str, int] = Field(
        default_factory=dict,
        description="Where processing starts: the offset of each source partition, e.g. {'0': 42}.",
    )
    at_timestamp_ms: int | None = Field(
        default=None, description="Or: processing starts at the first message of each partition from this moment on."
    )
    replace: bool = Field(default=False, description="Replace a store that has state (its other keys are deleted).")
    partitioner: str = Field(default="murmur2", description=f"The source producers' partitioner: {list(PARTITIONERS)}.")
    confirm: bool = Field(default=False, description=CONFIRM)


class TransformStateConfig(Config):
    store: str = Field(description="The store to migrate.")
    transformation: str = Field(
        description="The transformation, `module:function`, importable in this code location: it takes the latest "
        "snapshot's table and returns the new rows in the same layout."
    )
    engine: str = Field(default="spark", description=f"What the transformation takes: {list(ENGINES)}.")
    confirm: bool = Field(default=False, description=CONFIRM)


def bootstrap_state_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    @op(name=job_name(app, "bootstrap_state_op"))
    def bootstrap_state_op(
        context: OpExecutionContext, config: BootstrapStateConfig, kafka: KafkaResource, state_store: StateStoreResource
    ) -> None:
        _confirmed(config.confirm, f"bootstrap store {config.store!r} of app {app.name!r}")
        if bool(config.source_offsets) == (config.at_timestamp_ms is not None):
            raise Failure(description="Give either `source_offsets` or `at_timestamp_ms`: where processing starts.")
        positions: SourcePositions = {int(partition): offset for partition, offset in config.source_offsets.items()}
        if config.at_timestamp_ms is not None:
            positions = config.at_timestamp_ms
        partitioner = _choice(config.partitioner, {name: name for name in PARTITIONERS}, "partitioner")
        table = pq.read_table(config.table_path)
        context.log.info(f"Bootstrapping store {config.store} from {table.num_rows} rows of {config.table_path}")
        report = bootstrap_store(
            state_store.bind(app, kafka), config.store, table, positions, config.replace, partitioner
        )
        context.add_output_metadata({"rows": report.rows, "tombstones": report.tombstones})
        _record_snapshot(context, app, config.store, state_store, translator)

    @job(
        name=job_name(app, "bootstrap_state"),
        description=f"Make a Parquet table the state of a store of app `{app.name}`, with the source offsets its "
        "first worker starts from (refused without `confirm`, while workers run, or when the store has state "
        "unless `replace`).",
    )
    def bootstrap_state():
        bootstrap_state_op()

    return bootstrap_state


def transform_state_job(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR):
    @op(name=job_name(app, "transform_state_op"))
    def transform_state_op(
        context: OpExecutionContext,
        config: TransformStateConfig,
        kafka: KafkaResource,
        state_store: StateStoreResource,
        spark: SparkRunner,
    ) -> None:
        _confirmed(config.confirm, f"migrate store {config.store!r} of app {app.name!r}")
        engine = _choice(config.engine, {name: name for name in ENGINES}, "engine")
        session = None
        if engine == "spark":
            if not isinstance(spark, StatefulSparkResource):
                raise Failure(description="The spark resource runs Spark elsewhere: use engine arrow or pandas.")
            session = spark.spark_session
        transformation = _imported(config.transformation)
        report = transform_state(state_store.bind(app, kafka), config.store, transformation, engine, spark=session)
        context.add_output_metadata({"rows": report.rows, "changed": report.changed, "tombstones": report.tombstones})
        _record_snapshot(context, app, config.store, state_store, translator)

    @job(
        name=job_name(app, "transform_state"),
        description=f"Migrate a store of app `{app.name}` to a new shape: a transformation of its latest snapshot, "
        "written to the changelog and a new snapshot (refused without `confirm` and while workers run).",
    )
    def transform_state_job_():
        transform_state_op()

    return transform_state_job_


def _choice(name: str, choices: dict[str, T], what: str) -> T:
    if name not in choices:
        raise Failure(description=f"Unknown {what} {name!r}; use one of {list(choices)}.")
    return choices[name]


def _confirmed(confirm: bool, doing: str) -> None:
    if not confirm:
        raise Failure(description=f"Refusing to {doing}: set `confirm: true` in the run config. {CONFIRM}")


def _imported(path: str) -> Callable[[Any], Any]:
    module, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise Failure(
            description=f"Cannot import the transformation {path!r} ({error}): give `module:function`, importable in "
            "this code location."
        ) from None
    if not callable(function):
        raise Failure(description=f"The transformation {path!r} is not a function.")
    return function


def _record_snapshot(
    context: OpExecutionContext, app: App, store: str, state_store: StateStoreResource, translator: StatefulTranslator
) -> None:
    snapshots, manifest = snapshot_of(app, store, snapshot_root=state_store.snapshot_root)
    table = read_snapshot_table(app.row_decoder(store), snapshots, manifest)
    metadata = snapshot_metadata(manifest, snapshots.snapshot_location(manifest.snapshot_id))
    metadata |= state_table_metadata(table, snapshots.table_location(manifest.snapshot_id))
    context.log_event(AssetMaterialization(asset_key=snapshot_key(app, store, translator), metadata=metadata))
