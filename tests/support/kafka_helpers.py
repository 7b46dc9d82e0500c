"""Small helpers for tests of real services: Kafka topics, producing, reading, waiting, ports, HTTP."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from dagster_stateful import local_processes
from dagster_stateful.core.kafka.records import Headers

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )[name]
    future.result(timeout=30)
    wait_for(lambda: name in admin.list_topics(timeout=10).topics, 30, f"topic {name} to appear")
    wait_for(lambda: _answers_offsets(admin, name, partitions), 30, f"every partition of {name} to answer")


def _answers_offsets(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Whether every partition of a new topic has a leader that answers an offsets request."""
    requests = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    try:
        for future in admin.list_offsets(requests, request_timeout=10).values():
            future.result(timeout=15)
    except KafkaException:
        return False
    return True


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    headers: Headers | None = None,
    partitioner: str | None = None,
) -> None:
    """partitioner: librdkafka's `partitioner` setting (None: its default, consistent_random)."""
    settings = {"partitioner": partitioner} if partitioner else {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **settings})
    errors: list[str] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(str(error))

    for key, value in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, f"undelivered: {remaining}, errors: {errors}"


def produce_timed(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes | None, int]]) -> None:
    """Produce (key, value, timestamp in ms) records, each with its own timestamp, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(str(error))

    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp, on_delivery=on_delivery)
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, f"undelivered: {remaining}, errors: {errors}"


def read_messages(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every message (confluent_kafka.Message) of every partition of `topic`, from the beginning up
    to the current end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        pending = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        messages = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end within {timeout} s")
            for message in consumer.consume(500, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                messages.append(message)
                offset, partition = message.offset(), message.partition()
                assert offset is not None and partition is not None, "a consumed record has an offset and a partition"
                if offset >= ends[partition] - 1:
                    pending.discard(partition)
            # A transaction's commit marker can hold the last offset: no record is ever returned for it.
            for position in consumer.position([TopicPartition(topic, p) for p in pending]):
                if position.offset >= ends[position.partition]:
                    pending.discard(position.partition)
        return messages
    finally:
        consumer.close()


def read_committed(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every message of `topic` a `read_committed` reader sees (aborted transactions' records left
    out), read until each partition's position reaches its high watermark: every transaction on
    the topic must have ended, committed or aborted, or this fails after `timeout`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"committed-reader-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages: list = []
        deadline = time.monotonic() + timeout
        while True:
            positions = consumer.position([TopicPartition(topic, p) for p in partitions])
            if all(ends[tp.partition] == 0 or tp.offset >= ends[tp.partition] for tp in positions):
                return messages
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end {ends} within {timeout} s: at {positions}")
            for message in consumer.consume(500, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                messages.append(message)
    finally:
        consumer.close()


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record of `topic`, from the beginning up to the current end."""
    return [(message.key(), message.value()) for message in read_messages(bootstrap, topic, timeout)]


def read_keyed(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[bytes, bytes | None]]:
    """`read_all` of a topic whose every record has a key, such as a changelog; fails on a record without one."""
    records = []
    for key, value in read_all(bootstrap, topic, timeout):
        assert key is not None, f"a record of {topic} has no key"
        records.append((key, value))
    return records


def answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def free_port() -> int:
    return local_processes.free_port()


def latest_of(bootstrap: str, topic: str) -> dict[str, Any]:
    """Each key's latest JSON value in `topic` (None: deleted), read_committed: the topic read as a table."""
    latest: dict[str, Any] = {}
    for message in read_committed(bootstrap, topic):
        raw = message.value()
        latest[message.key().decode()] = None if raw is None else orjson.loads(raw)
    return latest
