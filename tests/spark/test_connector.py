"""Spark's Kafka connector, from the jar cache Maven fills, reads a topic of the test broker."""

import pytest
from dagster import job, op
from support.kafka_helpers import create_topic, produce

from dagster_stateful.resources import StatefulSparkResource
from dagster_stateful.spark.connector import installed_spark_version, kafka_connector_jars

pytestmark = pytest.mark.spark


def test_connector_jars_match_the_installed_pyspark():
    names = {path.name for path in kafka_connector_jars()}
    version = installed_spark_version()
    assert f"spark-sql-kafka-0-10_2.13-{version}.jar" in names
    assert f"spark-token-provider-kafka-0-10_2.13-{version}.jar" in names
    assert any(name.startswith("kafka-clients-") for name in names)
    assert not any(name.startswith("hadoop-") for name in names)


def test_spark_reads_records_produced_to_the_broker(spark, kafka_bootstrap, unique_name):
    topic = unique_name("spark-read")
    create_topic(kafka_bootstrap, topic, partitions=2)
    produced = {(f"k{i}".encode(), f"value-{i}".encode()) for i in range(25)}
    produce(kafka_bootstrap, topic, sorted(produced))

    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )

    rows = frame.select("key", "value", "partition").collect()
    assert {(bytes(row.key), bytes(row.value)) for row in rows} == produced
    assert {row.partition for row in rows} <= {0, 1}


def test_dagster_spark_resource_reads_kafka_through_the_connector(spark, kafka_bootstrap, unique_name):
    topic = unique_name("spark-dagster")
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, [(b"k", b"v1"), (b"k", b"v2")])
    resource = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    assert all(str(jar) in resource.effective_spark_config()["spark.jars"] for jar in kafka_connector_jars())

    @op
    def count_records(pyspark: StatefulSparkResource) -> int:
        return (
            pyspark.spark_session.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .count()
        )

    @job(resource_defs={"pyspark": resource})
    def count_job():
        count_records()

    result = count_job.execute_in_process()
    assert result.success and result.output_for_node("count_records") == 2
