"""The Spark jobs launched through Dagster Pipes: `python -m dagster_stateful.spark` in its own process.

Owns `SparkPipesResource`, the `SparkRunner` that runs the snapshot jobs (a store's, a partitioned
table's) and the SST writer of the Spark restore as a separate command (by default this
interpreter; `spark-submit` or a cluster's own submitter in production) under Dagster's
`PipesSubprocessClient`, so the job's logs and
materializations reach the run while Spark itself runs elsewhere; the same pattern reaches EMR,
Databricks or Kubernetes through their Pipes clients. Kafka settings travel to the command as
environment variables named on its command line, never as values on it, so secrets stay out of
process listings and logs. The SST writer's report comes back through the staging location.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dagster import (
    AssetKey,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    PipesClientCompletedInvocation,
    PipesSubprocessClient,
)
from pydantic import Field

from dagster_stateful.core.app import App
from dagster_stateful.core.recovery.offline_restore import SstWriter
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.sst_staging import SstStaging, WrittenFiles
from dagster_stateful.errors import RecoveryError
from dagster_stateful.resources import KafkaResource, SparkRunner

_KAFKA_OPTION_ENV = "DAGSTER_STATEFUL_KAFKA_OPTION_{}"


class SparkPipesResource(SparkRunner):
    """Runs the Spark jobs as `python -m dagster_stateful.spark ...` through Dagster Pipes."""

    command: list[str] = Field(
        default_factory=lambda: [sys.executable, "-m", "dagster_stateful.spark"],
        description="What runs the entry point; e.g. `[spark-submit, --deploy-mode, client, "
        "<site-packages>/dagster_stateful/spark/__main__.py]` to go through a cluster's submitter.",
    )
    master: str | None = Field(default=None, description="Spark master URL (`--master`); unset: the command's.")
    spark_config: dict[str, str] = Field(default_factory=dict, description="Spark settings passed as `--conf`.")
    cores: int = Field(
        default=2, description="Spark cores a restore gets (the planner weighs the Spark restore path by them)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of the command.")

    def take_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        options, env = _kafka_arguments(kafka)
        arguments = [
            "snapshot",
            f"--bootstrap={kafka.bootstrap_servers}",
            f"--group={app.consumer_group}",
            f"--source={app.config.task_topic}",
            f"--changelog-topic={app.changelog_topic(snapshots.store)}",
            f"--keep={keep}",
            *options,
        ]
        invocation = self._run(context, [*arguments, *_store_arguments(snapshots)], env, asset_key)
        return _reported_snapshot(invocation, snapshots, asset_key)

    def take_table_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        options, env = _kafka_arguments(kafka)
        table = snapshots.store
        arguments = [
            "table-snapshot",
            f"--bootstrap={kafka.bootstrap_servers}",
            f"--group={app.consumer_group}",
            f"--stream-topic={app.config.table_stream_topic(table)}",
            f"--topic={app.config.tables[table]}",
            f"--keep={keep}",
            *options,
            f"--app={snapshots.app}",
            f"--table={table}",
            f"--snapshot-root={snapshots.root}",
        ]
        return _reported_snapshot(self._run(context, arguments, env, asset_key), snapshots, asset_key)

    def sst_writer(self, context: OpExecutionContext) -> SstWriter:
        def write(
            snapshots: SnapshotStore, manifest: SnapshotManifest, partitions: list[int], staging: str
        ) -> WrittenFiles:
            arguments = [
                "sst",
                f"--snapshot-id={manifest.snapshot_id}",
                f"--partitions={','.join(map(str, partitions))}",
                f"--staging={staging}",
            ]
            self._run(context, [*arguments, *_store_arguments(snapshots)], {}, None)
            written = SstStaging(staging).read_report()
            if sorted(written) != sorted(partitions):
                raise RecoveryError(
                    f"the SST command wrote partitions {sorted(written)} into {staging}, not the requested "
                    f"{sorted(partitions)}; run the restore again"
                )
            return written

        return write

    def restore_cores(self) -> int:
        return self.cores

    def _run(
        self, context: OpExecutionContext, arguments: Sequence[str], env: dict[str, str], asset_key: AssetKey | None
    ) -> PipesClientCompletedInvocation:
        spark_arguments = [f"--master={self.master}"] if self.master else []
        spark_arguments += [f"--conf={key}={value}" for key, value in self.spark_config.items()]
        extras = {"asset_key": asset_key.to_user_string()} if asset_key else {}
        return PipesSubprocessClient().run(
            context=context,
            command=[*self.command, *arguments, *spark_arguments],
            env={**self.env, **env},
            extras=extras,
        )


def _reported_snapshot(
    invocation: PipesClientCompletedInvocation, snapshots: SnapshotStore, asset_key: AssetKey
) -> SnapshotManifest:
    """The manifest of the one snapshot the command reported for `asset_key`, found where it wrote it."""
    snapshot_ids = [
        _plain(result.metadata.get("snapshot_id"))
        for result in invocation.get_results()
        if isinstance(result, MaterializeResult) and result.asset_key == asset_key and result.metadata
    ]
    found = {m.snapshot_id: m for m in snapshots.manifests()}
    if len(snapshot_ids) != 1 or snapshot_ids[0] not in found:
        raise RecoveryError(
            f"the snapshot command for {snapshots.store!r} reported snapshots {snapshot_ids}, but "
            f"{snapshots.location} holds {sorted(found) or 'none'}: see the command's output in the run's logs"
        )
    return found[snapshot_ids[0]]


def _store_arguments(snapshots: SnapshotStore) -> list[str]:
    return [f"--app={snapshots.app}", f"--store={snapshots.store}", f"--snapshot-root={snapshots.root}"]


def _kafka_arguments(kafka: KafkaResource) -> tuple[list[str], dict[str, str]]:
    """`--kafka-option-env key=VAR` for each client setting beyond the bootstrap servers, and the variables."""
    settings = {k: str(v) for k, v in kafka.client_settings().items() if k != "bootstrap.servers"}
    env = {_KAFKA_OPTION_ENV.format(i): value for i, value in enumerate(settings.values())}
    arguments = [f"--kafka-option-env={key}={_KAFKA_OPTION_ENV.format(i)}" for i, key in enumerate(settings)]
    return arguments, env


def _plain(value: object) -> str:
    """A reported metadata value as text (Pipes wraps it in a `MetadataValue`)."""
    return str(value.value if isinstance(value, MetadataValue) else value)
