"""Spark's Kafka connector jars, fetched from Maven Central at exactly the installed pyspark version.

Owns the connector's jar bundle and the `spark.jars` value built from it. Spark's own
`--packages` resolver (Ivy) ignores Maven's settings and mirrors, so the jars are copied by Maven
into the project's jar cache instead, in a directory of their own (the broker's bundle wants a
different `kafka-clients`). Only the connector and its runtime dependencies are copied: pyspark
already ships the Hadoop client, compression codecs and logging jars.
"""

from __future__ import annotations

from pathlib import Path

from dagster_stateful.maven import JarBundle, bundle_jars

SCALA_BINARY_VERSION = "2.13"
CONNECTOR_ARTIFACTS = (
    f"spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}",
    f"spark-token-provider-kafka-0-10_{SCALA_BINARY_VERSION}",
    "kafka-clients",
    "commons-pool2",
)


def installed_spark_version() -> str:
    import pyspark

    return pyspark.__version__


def connector_bundle(spark_version: str | None = None) -> JarBundle:
    version = spark_version or installed_spark_version()
    return JarBundle(
        name=f"spark-sql-kafka-{version}",
        artifacts=(f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{version}",),
        include_artifact_ids=CONNECTOR_ARTIFACTS,
    )


def kafka_connector_jars(spark_version: str | None = None) -> list[Path]:
    """Local paths of the connector jars (fetched once), for `spark.jars`."""
    return bundle_jars(connector_bundle(spark_version))


def spark_jars_conf(spark_version: str | None = None) -> str:
    """The comma-separated `spark.jars` value. Set it before the process's first SparkSession starts."""
    return ",".join(str(path) for path in kafka_connector_jars(spark_version))
