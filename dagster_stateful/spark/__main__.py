"""`python -m dagster_stateful.spark snapshot ...`: the compaction snapshot job outside Dagster.

For teams that run Spark themselves (`spark-submit`, a cluster's scheduler): it builds the session
(the master from `--master` or the submitter, the Kafka connector jars added unless the submitter
ships them), takes a snapshot of one store's changelog as the Dagster snapshot asset does, and
prints the manifest as JSON on stdout. Kafka settings beyond the bootstrap servers (security) come
from `--kafka-option key=value` and never from the command line's secrets: pass a secret as
`--kafka-option-env key=ENV_VAR`, read from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    from pyspark.sql import SparkSession

    from dagster_stateful.core.kafka.clients import KafkaClients
    from dagster_stateful.core.recovery.snapshots import SnapshotStore
    from dagster_stateful.spark.connector import spark_jars_conf
    from dagster_stateful.spark.snapshots import snapshot_changelog

    options = dict(_pair(entry) for entry in arguments.kafka_option)
    options |= {key: os.environ[variable] for key, variable in map(_pair, arguments.kafka_option_env)}
    builder = SparkSession.builder.appName(f"dagster-stateful snapshot {arguments.changelog_topic}")
    if arguments.master:
        builder = builder.master(arguments.master)
    if not arguments.no_connector_jars:
        builder = builder.config("spark.jars", spark_jars_conf())
    spark = builder.config("spark.pyspark.python", sys.executable).getOrCreate()
    try:
        kafka = KafkaClients({"bootstrap.servers": arguments.bootstrap, **options})
        spark_options = {
            "kafka.bootstrap.servers": arguments.bootstrap,
            **{f"kafka.{k}": v for k, v in options.items()},
        }
        taken = snapshot_changelog(
            spark,
            kafka,
            spark_options,
            arguments.group,
            arguments.source,
            arguments.changelog_topic,
            SnapshotStore(arguments.snapshot_root, arguments.app, arguments.store),
            arguments.keep,
        )
    finally:
        spark.stop()
    print(json.dumps(asdict(taken.manifest), default=str))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dagster_stateful.spark", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    snapshot = commands.add_parser("snapshot", help="snapshot one store's changelog; print the manifest")
    snapshot.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    snapshot.add_argument("--app", required=True, help="the app's name (snapshots live under it)")
    snapshot.add_argument("--store", required=True)
    snapshot.add_argument("--group", required=True, help="the app's consumer group (its name, by default)")
    snapshot.add_argument("--source", required=True, help="the app's source topic")
    snapshot.add_argument("--changelog-topic", required=True)
    snapshot.add_argument("--snapshot-root", required=True, help="a path or URI Spark and pyarrow both write")
    snapshot.add_argument("--keep", type=int, default=3, help="snapshots kept; older ones are deleted")
    snapshot.add_argument("--master", help="Spark master URL (default: the submitter's, or local[*])")
    snapshot.add_argument("--no-connector-jars", action="store_true", help="the submitter ships the Kafka jars")
    snapshot.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    snapshot.add_argument("--kafka-option-env", action="append", default=[], metavar="KEY=ENV_VAR")
    return parser


def _pair(entry: str) -> tuple[str, str]:
    key, separator, value = entry.partition("=")
    if not separator or not key:
        raise SystemExit(f"error: expected KEY=VALUE, got {entry!r}")
    return key, value


if __name__ == "__main__":
    sys.exit(main())
