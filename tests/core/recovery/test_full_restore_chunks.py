"""A full restore ingests its keys as SST files in chunks: overwrites and deletes across chunks, and
a restore suspended between chunks and continued, give the changelog's latest value per key."""

from __future__ import annotations

import random
from pathlib import Path

from confluent_kafka import Producer
from support.kafka_helpers import create_topic, read_keyed

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog_format import source_offset_header
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition

KEYS = 60
RECORDS = 1_500
ALL_COMMITTED = 10**9


def write_changelog(bootstrap: str, topic: str) -> None:
    """Puts and tombstones on a few keys, so that every chunk overwrites and deletes earlier ones."""
    chooser = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for offset in range(RECORDS):
        key = f"k{chooser.randrange(KEYS):03d}".encode()
        value = None if chooser.random() < 0.2 else f"v{offset}".encode()
        producer.produce(topic, key=key, value=value, partition=0, headers=source_offset_header(offset))
    producer.flush(30)


def changelog_latest(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    for key, value in read_keyed(bootstrap, topic):
        latest[key] = value
    return {key: value for key, value in latest.items() if value is not None}


def fresh_store(root: Path, name: str) -> StorePartition:
    store = StateDirectory(root, AppConfig(name=name, source=f"{name}-source", stores=("totals",))).partition(
        "totals", 0
    )
    store.open()
    return store


def test_a_full_restore_in_many_chunks_keeps_the_latest_value_per_key(kafka_bootstrap, unique_name, tmp_path):
    name = unique_name("chunks")
    store = fresh_store(tmp_path, name)
    create_topic(kafka_bootstrap, store.changelog_topic, 1, {"cleanup.policy": "compact"})
    write_changelog(kafka_bootstrap, store.changelog_topic)
    expected = changelog_latest(kafka_bootstrap, store.changelog_topic)
    assert 0 < len(expected) < KEYS, "some keys end deleted, the others hold a value"
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    consumer = kafka.consumer({"group.id": f"{name}-restore", **RESTORE_CONSUMER_CONFIG})
    try:
        restorer = Restorer(kafka, consumer, Listeners(), batch_size=40, chunk_records=25)
        replay = restorer.begin(store, ALL_COMMITTED)
        assert replay is not None and replay.report.kind == "full"
        while replay.position < RECORDS // 2:
            replay.step()
        replay.suspend()
        halfway = store.changelog_offset
        assert halfway is not None and 0 < halfway < RECORDS, "the suspended restore kept its position"
        store.close()

        store = fresh_store(tmp_path, name)
        assert store.changelog_offset == halfway, "what the suspended restore ingested stayed, with its position"
        report = restorer.restore(store, ALL_COMMITTED)
        assert report is not None and report.kind == "partial" and report.start_offset == halfway
        assert dict(store.items()) == expected

        store.wipe()
        store = fresh_store(tmp_path, name)
        report = restorer.restore(store, ALL_COMMITTED)
        assert report is not None and report.kind == "full" and report.completed
        assert dict(store.items()) == expected
        assert store.changelog_offset == RECORDS and store.source_offset == ALL_COMMITTED
    finally:
        store.close()
        consumer.close()
