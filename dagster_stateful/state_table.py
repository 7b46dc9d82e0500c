"""A store's state as a table, in the engine a user works in: Arrow, pandas or Spark.

Owns `bootstrap_store` (a batch table made a store's state, see `core.recovery.bootstrap`;
`snapshot_source_offsets` gives where a snapshot's state stands in the source),
`transform_state` (the state migrated to a new shape, see `core.recovery.migration`) and
`read_state_table`, Flink's State Processor API "read" for Kafka state: the rows of a
snapshot (the latest by default), decoded with the app's serializers as
`core.recovery.state_table` lays them out (`read_table_state`: a partitioned table's, decoded
with the table's). Arrow and pandas read the decoded Parquet written beside the snapshot (or
decode the raw snapshot when none was written); Spark reads that Parquet itself, writing it first
when a snapshot has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.partitioner import Partitioner
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.table_snapshots import table_snapshots
from dagster_stateful.core.state.decoding import RowDecoder, StoreShape
from dagster_stateful.core.state_tables.bootstrap import BootstrapReport, SourcePositions, StoreTarget, bootstrap_arrow
from dagster_stateful.core.state_tables.migration import MigrationReport, migrate_snapshot
from dagster_stateful.core.state_tables.table import (
    read_snapshot_table,
    table_layout,
    table_written,
    write_snapshot_table,
)
from dagster_stateful.errors import ConfigurationError, StateTableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ENGINES",
    "Engine",
    "as_arrow",
    "bootstrap_store",
    "read_state_table",
    "read_table_state",
    "snapshot_of",
    "snapshot_source_offsets",
    "table_row_decoder",
    "transform_state",
]

Engine = Literal["arrow", "pandas", "spark"]
ENGINES: tuple[Engine, ...] = ("arrow", "pandas", "spark")


def read_state_table(
    app: App,
    store: str,
    snapshot: str | None = None,
    engine: Engine = "arrow",
    snapshot_root: str | None = None,
    spark: SparkSession | None = None,
) -> Any:
    """The state of `store` in a snapshot (`snapshot`: its id; the latest by default) as a
    `pyarrow.Table`, a pandas DataFrame or a Spark DataFrame (`engine`), one row per state value:
    partition, message key, state key (a window store's: window start and end; an expiring
    store's: also its expiry), and the value, one column per field of a JSON object.

    snapshot_root: where the app's snapshots live (default: the app's `snapshot_root`).
    spark: the session for `engine="spark"` (default: the active one, else a local one).
    """
    _check_engine(engine, "read_state_table")
    snapshots, manifest = snapshot_of(app, store, snapshot, snapshot_root)
    return _decoded(app.row_decoder(store), snapshots, manifest, engine, spark)


def read_table_state(
    app: App,
    table: str,
    snapshot: str | None = None,
    engine: Engine = "arrow",
    snapshot_root: str | None = None,
    spark: SparkSession | None = None,
) -> Any:
    """The rows of partitioned table `table` (`App.table`) in a snapshot of its store (`snapshot`:
    its id; the latest by default), as `read_state_table` gives a store's: one row per key, with
    columns `partition`, `key` and the value (one column per field of a JSON object), decoded with
    the table's serializers. A versioned table has no snapshots (`core.recovery.table_snapshots`)."""
    _check_engine(engine, "read_table_state")
    declared = app.partitioned_table(table)
    snapshots = table_snapshots(snapshot_root or app.snapshot_root, app.name, table, declared.versioned)
    return _decoded(
        table_row_decoder(app, table), snapshots, _manifest(snapshots, snapshot, f"table {table!r}"), engine, spark
    )


def table_row_decoder(app: App, table: str) -> RowDecoder:
    """Decodes the rows of partitioned table `table`'s store with the table's serializers."""
    declared = app.partitioned_table(table)
    return RowDecoder(StoreShape(table, table=True), declared.key_serde, declared.value_serde)


def _check_engine(engine: str, function: str) -> None:
    if engine not in ENGINES:
        raise ConfigurationError(f"unknown engine {engine!r} for {function}; use one of {list(ENGINES)}")


def _decoded(
    decoder: RowDecoder,
    snapshots: SnapshotStore,
    manifest: SnapshotManifest,
    engine: Engine,
    spark: SparkSession | None,
) -> Any:
    """The snapshot's decoded table in `engine` (Spark reads the Parquet written beside it, written now if missing)."""
    if engine == "spark":
        if not table_written(snapshots, manifest.snapshot_id):
            write_snapshot_table(decoder, snapshots, manifest)
        return _spark(spark).read.parquet(snapshots.table_location(manifest.snapshot_id))
    table: pa.Table = read_snapshot_table(decoder, snapshots, manifest)
    return table.to_pandas() if engine == "pandas" else table


def bootstrap_store(
    app: App,
    store: str,
    dataframe: Any,
    source_positions: SourcePositions,
    replace: bool = False,
    partitioner: Partitioner = "murmur2",
    snapshot_root: str | None = None,
) -> BootstrapReport:
    """Make a batch table the state of `store`, and start the app's processing at `source_positions`.

    dataframe: a `pyarrow.Table`, pandas or Spark DataFrame with columns `key` (message key),
        `state_key` and `value`, and optionally `partition` (checked against the partitioner).
    source_positions: an offset per source partition, or a moment (datetime, or epoch ms) whose
        offsets the broker finds: the first worker processes the messages from there on.
    replace: take a store that has state (its changelog's other keys are tombstoned).
    partitioner: what the source's producers partition keys with: "murmur2" (Kafka's default, and
        librdkafka's `murmur2_random`) or "consistent" (librdkafka's default, CRC-32).
    The app's topics are provisioned first (as its first worker would), then every row is checked
    before any state is written; see `core.recovery.bootstrap`.
    """
    root = snapshot_root or app.snapshot_root
    if not root:
        raise ConfigurationError(f"bootstrapping store {store!r} needs a snapshot location: pass snapshot_root=")
    table = as_arrow(dataframe)
    target = StoreTarget(app.config, app.kafka, app.state, app.row_decoder(store))
    app.provision()
    return bootstrap_arrow(target, table, source_positions, root, replace, partitioner)


def transform_state(
    app: App,
    store: str,
    fn: Callable[[Any], Any],
    engine: Engine = "spark",
    snapshot_root: str | None = None,
    spark: SparkSession | None = None,
) -> MigrationReport:
    """Migrate `store`'s state to a new shape: `fn` takes the latest snapshot's table (a Spark
    DataFrame, or Arrow or pandas as `engine` says) and returns the new rows in the same layout
    (`partition`, `key`, `state_key`, and a `value` column or one column per field of the values).

    The changed keys are written to the changelog and a new snapshot at the same source offsets is
    made the latest, so that restores from the snapshot and from the changelog both give the new
    state. The app's workers must be stopped and the snapshot must reach the changelog's end (take
    one first); see `core.recovery.migration`.
    """
    snapshots, manifest = snapshot_of(app, store, None, snapshot_root)
    decoder = app.row_decoder(store)
    if not table_written(snapshots, manifest.snapshot_id):
        write_snapshot_table(decoder, snapshots, manifest)
    old = read_state_table(app, store, manifest.snapshot_id, engine, snapshots.root, spark)
    new = as_arrow(fn(old))
    json_text = table_layout(snapshots, manifest.snapshot_id) == "json"
    target = StoreTarget(app.config, app.kafka, app.state, decoder)
    return migrate_snapshot(target, snapshots, manifest, new, json_text)


def as_arrow(dataframe: Any) -> pa.Table:
    """A pyarrow Table of a pyarrow Table, a pandas DataFrame or a Spark DataFrame (collected to the driver)."""
    if isinstance(dataframe, pa.Table):
        return dataframe
    module = type(dataframe).__module__
    if module.startswith("pandas"):
        return pa.Table.from_pandas(dataframe, preserve_index=False)
    if module.startswith("pyspark"):
        return dataframe.toArrow()
    raise ConfigurationError(
        f"a state table is a pyarrow Table, a pandas DataFrame or a Spark DataFrame, not {type(dataframe).__name__}"
    )


def snapshot_source_offsets(
    app: App, store: str, snapshot: str | None = None, snapshot_root: str | None = None
) -> dict[int, int]:
    """Per source partition, the offset the state of a snapshot (the latest by default) stands at:
    the group's commits it was cut at. An app bootstrapped from the snapshot's table starts there,
    so that no message is lost or counted twice."""
    snapshots, manifest = snapshot_of(app, store, snapshot, snapshot_root)
    recorded = manifest.extra.get("committed_source_offsets")
    if recorded is None:
        raise StateTableError(
            f"snapshot {manifest.snapshot_id} of store {store!r} under {snapshots.location} records no source "
            "offsets (it predates them): take a new snapshot, or give the offsets yourself"
        )
    return {int(partition): offset or 0 for partition, offset in recorded.items()}


def snapshot_of(
    app: App, store: str, snapshot: str | None = None, snapshot_root: str | None = None
) -> tuple[SnapshotStore, SnapshotManifest]:
    """The snapshots of `store` and the finished snapshot `snapshot` (the latest by default)."""
    app.store_shape(store)  # an unknown store is refused here, before any file is read
    root = snapshot_root or app.snapshot_root
    if not root:
        raise ConfigurationError(
            f"no snapshot location for app {app.name!r}: pass snapshot_root= (the `state_store` resource's "
            "snapshot_root) or give the App one"
        )
    snapshots = SnapshotStore(root, app.name, store)
    return snapshots, _manifest(snapshots, snapshot, f"store {store!r}")


def _manifest(snapshots: SnapshotStore, snapshot: str | None, what: str) -> SnapshotManifest:
    """The finished snapshot `snapshot` (the latest by default) of `what` (a store or a table)."""
    finished = snapshots.manifests()
    if snapshot is None and finished:
        return finished[-1]
    for manifest in finished:
        if manifest.snapshot_id == snapshot:
            return manifest
    wanted = "finished snapshot" if snapshot is None else f"finished snapshot {snapshot!r}"
    raise ConfigurationError(
        f"{what} of app {snapshots.app!r} has no {wanted} under "
        f"{snapshots.location} (finished: {[m.snapshot_id for m in finished] or 'none'}); materialize its "
        "snapshot asset (or run the compaction job) first"
    )


def _spark(spark: SparkSession | None) -> SparkSession:
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession.builder.master("local[*]").getOrCreate()
