"""Dagster resources: how a code location reaches Kafka, where state lives, and Spark.

Owns configuration. `KafkaResource` turns bootstrap servers and client settings (secrets through
`EnvVar`, never logged) into the core's `KafkaClients`; `StateStoreResource` names the state
directory and binds an app to it and to a connection. `SparkRunner` is how a run reaches Spark for
the snapshot assets (stores' and partitioned tables') and the Spark restore, under the resource
key `spark`: `StatefulSparkResource` (dagster-pyspark's resource with Spark's Kafka connector jars
on the classpath) runs the jobs in the run's own process; `SparkPipesResource` (in `pipes`)
launches them through Dagster Pipes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dagster import AssetKey, ConfigurableResource, InitResourceContext, OpExecutionContext
from dagster_pyspark import PySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.recovery.offline_restore import SstWriter
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore


class KafkaResource(ConfigurableResource):
    """Connection to a Kafka cluster, shared by every asset, job and sensor of a code location."""

    bootstrap_servers: str = Field(description="Comma-separated host:port list, e.g. `127.0.0.1:9092`.")
    security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    sasl_mechanism: str | None = Field(default=None, description="e.g. PLAIN, SCRAM-SHA-512 (SASL only).")
    sasl_username: str | None = Field(default=None, description="SASL user name; pass it with `EnvVar`.")
    sasl_password: str | None = Field(default=None, description="SASL password; always pass it with `EnvVar`.")
    ssl_ca_location: str | None = Field(
        default=None, description="PEM file of the CA certificates that signed the brokers' (TLS)."
    )
    admin_timeout_seconds: float = Field(
        default=30.0,
        description="How long Kafka reads and topic changes retry transient errors (a broker outage, a "
        "leader moving) before the run fails; raise it to let workers ride out longer outages.",
    )
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Further librdkafka settings applied to every client (e.g. `ssl.ca.location`).",
    )
    spark_kafka_config: dict[str, str] = Field(
        default_factory=dict,
        description="Java client settings for Spark's Kafka source, over those translated from the above "
        "(for what has no translation: Kerberos, OAUTHBEARER; never a secret in clear).",
    )

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings common to producers, consumers and admin clients."""
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
        }
        settings.update({key: value for key, value in optional.items() if value})  # empty: unset (an env default)
        settings.update(self.client_config)
        return settings

    def spark_kafka_options(self) -> dict[str, str]:
        """The same connection as options of Spark's Kafka source (`kafka.*`, the Java client's
        settings; secrets only by reference, see `spark.kafka_options`)."""
        from dagster_stateful.spark.kafka_options import process_secrets, spark_kafka_options

        return spark_kafka_options(self.client_settings(), process_secrets(), self.spark_kafka_config)

    def clients(self) -> KafkaClients:
        return KafkaClients(self.client_settings(), admin_timeout_seconds=self.admin_timeout_seconds)


class StateStoreResource(ConfigurableResource):
    """Where the apps of this code location keep their RocksDB state on the machine that runs them."""

    state_dir: str = Field(description="Directory holding `<app>/<store>/<partition>/` RocksDB databases.")
    snapshot_root: str | None = Field(
        default=None,
        description="Path or URI (file://, s3a://, ...) Spark writes store snapshots to and restores "
        "read them from; unset: no snapshots.",
    )

    def bind(self, app: App, kafka: KafkaResource) -> App:
        """The app, connected through `kafka`, keeping its state under `state_dir` and finding its
        stores' snapshots under `snapshot_root`."""
        return app.bind(kafka=kafka.clients(), state_dir=self.state_dir, snapshot_root=self.snapshot_root)


class SparkRunner(ConfigurableResource):
    """How a run reaches Spark: the snapshot job and the SST writer of the Spark restore."""

    def take_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        """Fold the changelog of the store `snapshots` holds into its next snapshot; returns its manifest."""
        raise NotImplementedError

    def take_table_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        """Fold the topic of the partitioned table `snapshots` holds (`table_snapshots`) into its next
        snapshot, up to the positions the group's commits applied it to; returns its manifest."""
        raise NotImplementedError

    def sst_writer(self, context: OpExecutionContext) -> SstWriter:
        """What writes a snapshot's partitions as SST files into a staging location."""
        raise NotImplementedError

    def restore_cores(self) -> int:
        """Spark cores a restore gets; the planner weighs the Spark path by them."""
        raise NotImplementedError


class StatefulSparkResource(PySparkResource, SparkRunner):
    """dagster-pyspark's resource, with Spark's Kafka connector jars added to `spark.jars`.

    The jars (fetched once from Maven Central) are resolved when a run first needs Spark, not
    when the code location loads. `spark.master` defaults to `local[*]`; set a cluster's master
    URL to run the same jobs there.
    """

    include_kafka_connector: bool = Field(
        default=True, description="Add spark-sql-kafka and its dependencies to spark.jars."
    )

    def effective_spark_config(self) -> dict[str, Any]:
        config = {"spark.master": "local[*]", "spark.ui.showConsoleProgress": "false", **self.spark_config}
        if str(config["spark.master"]).startswith("local"):
            # Python workers of a local Spark run this interpreter (with rocksdict and pyarrow), not `python3`.
            config.setdefault("spark.pyspark.python", sys.executable)
        if self.include_kafka_connector:
            from dagster_stateful.spark.connector import spark_jars_conf

            jars = [jar for jar in (config.get("spark.jars", ""), spark_jars_conf()) if jar]
            config["spark.jars"] = ",".join(jars)
        return config

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Nothing yet: Spark starts when a step first asks for the session, so a run whose steps
        never do (a migration in pandas, a restore the planner keeps local) starts none."""

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            config = self.effective_spark_config()
            if "spark.pyspark.python" in config:
                os.environ.setdefault("PYSPARK_PYTHON", config["spark.pyspark.python"])  # read by the driver too
            self._spark_session = spark_session_from_config(config)
        return self._spark_session

    def take_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        from dagster_stateful.spark.snapshots import snapshot_changelog

        return snapshot_changelog(
            self.spark_session,
            kafka.clients(),
            kafka.spark_kafka_options(),
            app.consumer_group,
            app.config.task_topic,
            app.changelog_topic(snapshots.store),
            snapshots,
            keep,
        ).manifest

    def take_table_snapshot(
        self,
        context: OpExecutionContext,
        kafka: KafkaResource,
        app: App,
        snapshots: SnapshotStore,
        keep: int,
        asset_key: AssetKey,
    ) -> SnapshotManifest:
        from dagster_stateful.spark.table_snapshots import snapshot_table

        table = snapshots.store
        return snapshot_table(
            self.spark_session,
            kafka.clients(),
            kafka.spark_kafka_options(),
            app.consumer_group,
            app.config.table_stream_topic(table),
            app.config.tables[table],
            snapshots,
            keep,
        ).manifest

    def sst_writer(self, context: OpExecutionContext) -> SstWriter:
        from dagster_stateful.spark.bulk_restore import write_sst_files

        session = self.spark_session
        return lambda snapshots, manifest, partitions, staging: write_sst_files(
            session, snapshots, manifest.snapshot_id, partitions, staging
        )

    def restore_cores(self) -> int:
        return int(self.spark_session.sparkContext.defaultParallelism)
