"""The development broker: a real Kafka that produces, consumes, keeps topic config and compacts."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, ConfigResource
from support.kafka_helpers import create_topic, produce, read_all, wait_for


def test_broker_produces_consumes_and_keeps_topic_config(kafka_bootstrap, unique_name):
    topic = unique_name("roundtrip")
    create_topic(kafka_bootstrap, topic, partitions=3, config={"retention.ms": "3600000"})

    produce(kafka_bootstrap, topic, [(b"k1", b"hello")])

    assert read_all(kafka_bootstrap, topic) == [(b"k1", b"hello")]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["retention.ms"].value == "3600000"
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3


def test_compacted_topic_keeps_only_the_latest_value_per_key(kafka_bootstrap, unique_name):
    topic = unique_name("compacted")
    create_topic(
        kafka_bootstrap,
        topic,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
        },
    )
    keys = [f"key-{i}".encode() for i in range(4)]
    produce(kafka_bootstrap, topic, [(key, f"v{version}".encode()) for version in range(10) for key in keys])
    # The cleaner never touches the active segment; one more record after segment.ms rolls it.
    time.sleep(0.3)
    produce(kafka_bootstrap, topic, [(b"roll", b"x")])

    def compacted() -> list | None:
        records = [record for record in read_all(kafka_bootstrap, topic) if record[0] != b"roll"]
        return records if len(records) == len(keys) else None

    records = wait_for(compacted, timeout=90, what=f"the log cleaner to compact {topic}", interval=1.0)
    assert dict(records) == dict.fromkeys(keys, b"v9")
