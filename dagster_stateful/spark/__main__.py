"""`python -m dagster_stateful.spark snapshot|table-snapshot|sst ...`: the Spark jobs outside the Dagster process.

For teams that run Spark themselves (`spark-submit`, a cluster's scheduler) and for Dagster Pipes
(`SparkPipesResource` launches this). `snapshot` folds one store's changelog into its next
snapshot, as the Dagster snapshot asset does, and prints the manifest as JSON on stdout;
`table-snapshot` does the same for a partitioned table's store, from the table's topic. `sst`
writes the SST files of chosen partitions from a snapshot into a staging location (see
`SstStaging`), leaves the report of what it wrote there and prints it; a worker then fetches and
ingests exactly those files. It builds the session itself (the master from `--master` or the
submitter; the snapshots add the Kafka connector jars unless the submitter ships them). Kafka
settings beyond the bootstrap servers come from `--kafka-option key=value`, and secrets never from
the command line: pass one as `--kafka-option-env key=ENV_VAR`, read from the environment. Under
Dagster Pipes it also reports to the launching run: the snapshot as a materialization of the asset
named by the `asset_key` extra, the SST report as a custom message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_pipes import PipesContext
    from pyspark.sql import SparkSession

    from dagster_stateful.core.kafka.clients import KafkaClients
    from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    command: Callable[[argparse.Namespace, SparkSession, PipesContext | None], dict[str, Any]] = arguments.command
    with _pipes() as pipes:
        spark = _session(arguments)
        try:
            result = command(arguments, spark, pipes)
        finally:
            spark.stop()
    print(json.dumps(result, default=str))
    return 0


def _snapshot(arguments: argparse.Namespace, spark: SparkSession, pipes: PipesContext | None) -> dict[str, Any]:
    from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
    from dagster_stateful.spark.snapshots import snapshot_changelog

    kafka, spark_options = _kafka(arguments)
    snapshots = SnapshotStore(arguments.snapshot_root, arguments.app, arguments.store)
    taken = snapshot_changelog(
        spark,
        kafka,
        spark_options,
        arguments.group,
        arguments.source,
        arguments.changelog_topic,
        snapshots,
        arguments.keep,
    )
    return _reported(taken.manifest, pipes)


def _table_snapshot(arguments: argparse.Namespace, spark: SparkSession, pipes: PipesContext | None) -> dict[str, Any]:
    from dagster_stateful.core.recovery.table_snapshots import table_snapshots
    from dagster_stateful.spark.table_snapshots import snapshot_table

    kafka, spark_options = _kafka(arguments)
    snapshots = table_snapshots(arguments.snapshot_root, arguments.app, arguments.table)
    taken = snapshot_table(
        spark, kafka, spark_options, arguments.group, arguments.stream_topic, arguments.topic, snapshots, arguments.keep
    )
    return _reported(taken.manifest, pipes)


def _kafka(arguments: argparse.Namespace) -> tuple[KafkaClients, dict[str, str]]:
    """The Kafka clients of the command's settings, and Spark's Kafka source options of them."""
    from dagster_stateful.core.kafka.clients import KafkaClients
    from dagster_stateful.spark.kafka_options import process_secrets, spark_kafka_options

    options = dict(_pair(entry) for entry in arguments.kafka_option)
    options |= {key: os.environ[variable] for key, variable in map(_pair, arguments.kafka_option_env)}
    settings = {"bootstrap.servers": arguments.bootstrap, **options}
    return KafkaClients(settings), spark_kafka_options(settings, process_secrets())


def _reported(manifest: SnapshotManifest, pipes: PipesContext | None) -> dict[str, Any]:
    """The manifest as JSON, reported under Pipes as a materialization of the `asset_key` extra."""
    if pipes is not None:
        pipes.report_asset_materialization(
            metadata={"snapshot_id": manifest.snapshot_id}, asset_key=pipes.get_extra("asset_key")
        )
    return asdict(manifest)


def _sst(arguments: argparse.Namespace, spark: SparkSession, pipes: PipesContext | None) -> dict[str, Any]:
    from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
    from dagster_stateful.core.recovery.sst_staging import SstStaging
    from dagster_stateful.errors import ConfigurationError
    from dagster_stateful.spark.bulk_restore import write_sst_files

    snapshots = SnapshotStore(arguments.snapshot_root, arguments.app, arguments.store)
    found = {m.snapshot_id: m for m in snapshots.manifests()}
    if arguments.snapshot_id not in found:
        raise ConfigurationError(
            f"no finished snapshot {arguments.snapshot_id!r} under {snapshots.location} "
            f"(finished: {sorted(found) or 'none'}); take one with the `snapshot` command first"
        )
    partitions = sorted({int(p) for p in arguments.partitions.split(",") if p.strip()})
    staging = SstStaging(arguments.staging)
    written = write_sst_files(spark, snapshots, arguments.snapshot_id, partitions, staging.location)
    staging.write_report(written)
    report = {"staging": staging.location, "files": {str(p): files for p, (files, _) in written.items()}}
    report["keys"] = {str(p): keys for p, (_, keys) in written.items()}
    if pipes is not None:
        pipes.report_custom_message(report)
    return report


def _session(arguments: argparse.Namespace) -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"dagster-stateful {arguments.command.__name__.strip('_')}")
    if arguments.master:
        builder = builder.master(arguments.master)
    if arguments.command in (_snapshot, _table_snapshot) and not arguments.no_connector_jars:
        from dagster_stateful.spark.connector import spark_jars_conf

        builder = builder.config("spark.jars", spark_jars_conf())
    settings = {"spark.pyspark.python": sys.executable, **dict(map(_pair, arguments.conf))}
    # PySpark starts executors' Python workers with PYSPARK_PYTHON, not with the setting.
    os.environ.setdefault("PYSPARK_PYTHON", settings["spark.pyspark.python"])
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _pipes() -> AbstractContextManager[PipesContext | None]:
    """The Dagster Pipes context when a Dagster run launched this process, else nothing."""
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    return open_dagster_pipes() if PipesEnvVarParamsLoader().is_dagster_pipes_process() else nullcontext()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dagster_stateful.spark", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    snapshot = commands.add_parser("snapshot", help="snapshot one store's changelog; print the manifest")
    snapshot.set_defaults(command=_snapshot)
    snapshot.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    _store_arguments(snapshot)
    snapshot.add_argument("--group", required=True, help="the app's consumer group (its name, by default)")
    snapshot.add_argument("--source", required=True, help="the app's source topic")
    snapshot.add_argument("--changelog-topic", required=True)
    snapshot.add_argument("--keep", type=int, default=3, help="snapshots kept; older ones are deleted")
    _kafka_arguments(snapshot)
    table = commands.add_parser(
        "table-snapshot", help="snapshot a partitioned table's topic up to the committed positions; print the manifest"
    )
    table.set_defaults(command=_table_snapshot)
    table.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    table.add_argument("--app", required=True, help="the app's name (snapshots live under it)")
    table.add_argument("--table", required=True, help="the partitioned table's name (not a versioned table's)")
    table.add_argument("--snapshot-root", required=True, help="a path or URI Spark and pyarrow both write")
    table.add_argument("--master", help="Spark master URL (default: the submitter's, or local[*])")
    table.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    table.add_argument("--group", required=True, help="the app's consumer group (its name, by default)")
    table.add_argument("--stream-topic", required=True, help="the topic whose commits record the table's positions")
    table.add_argument("--topic", required=True, help="the table's topic")
    table.add_argument("--keep", type=int, default=3, help="snapshots kept; older ones are deleted")
    _kafka_arguments(table)
    sst = commands.add_parser("sst", help="write chosen partitions of a snapshot as SST files into a staging location")
    sst.set_defaults(command=_sst)
    _store_arguments(sst)
    sst.add_argument("--snapshot-id", required=True, help="the snapshot to write (a finished one)")
    sst.add_argument("--partitions", required=True, help="comma-separated Kafka partitions, e.g. 0,1,2")
    sst.add_argument("--staging", required=True, help="where to stage the files (a path or URI, see SstStaging)")
    return parser


def _kafka_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--no-connector-jars", action="store_true", help="the submitter ships the Kafka jars")
    command.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    command.add_argument("--kafka-option-env", action="append", default=[], metavar="KEY=ENV_VAR")


def _store_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--app", required=True, help="the app's name (snapshots live under it)")
    command.add_argument("--store", required=True)
    command.add_argument("--snapshot-root", required=True, help="a path or URI Spark and pyarrow both write")
    command.add_argument("--master", help="Spark master URL (default: the submitter's, or local[*])")
    command.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")


def _pair(entry: str) -> tuple[str, str]:
    key, separator, value = entry.partition("=")
    if not separator or not key:
        raise SystemExit(f"error: expected KEY=VALUE, got {entry!r}")
    return key, value


if __name__ == "__main__":
    sys.exit(main())
