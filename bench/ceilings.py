"""What Python and confluent-kafka allow on bench_compare.py's workloads, with no engine at all.

Three plain loops over a source topic, each from the start to the high watermarks of every
partition with a consumer of its own (`consume(1000)` batches, 5 MiB fetched per partition: with
librdkafka's default of 1 MiB, consuming alone reaches only a third of this on the benchmark's
topics; its other settings are the defaults):

- `consume_only`: consume and count; the most any Python consumer of these records can do.
- `parse_and_total`: also parse each value's JSON and add its "amount" to an in-memory total per
  key (a dict): the computation with no state store, no changelog, no commit.
- `with_changelog`: also, every `commit_interval` seconds and at the end, produce one record per key
  changed since the last commit to a changelog topic (the latest total, as a state store's
  changelog holds), and wait until they are delivered.

Each returns a `Ceiling` (messages, seconds, the totals it computed where it computes any) so the
caller can check the totals like any system's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from dagster_stateful.core.kafka.clients import FETCH_QUEUE_BACKOFF_MS

CONSUME_BATCH = 1000
PARTITION_FETCH_BYTES = 5 * 1024 * 1024


@dataclass
class Ceiling:
    name: str
    messages: int
    seconds: float
    totals: dict[bytes, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def _consume_all(bootstrap: str, topic: str, partitions: int, each_batch: Callable[[list[Message]], None]) -> int:
    """Every record of `topic` (up to its high watermarks now) through `each_batch`; returns the count.
    The topic must not be compacted: its records are counted, not their offsets looked at."""
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    try:
        ranges = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)]
        expected = sum(high - low for low, high in ranges)
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in enumerate(ranges)])
        count = 0
        while count < expected:
            batch = consumer.consume(CONSUME_BATCH, timeout=1.0)
            each_batch(batch)
            count += len(batch)
        return count
    finally:
        consumer.close()


def consume_only(bootstrap: str, topic: str, partitions: int) -> Ceiling:
    began = time.monotonic()
    count = _consume_all(bootstrap, topic, partitions, lambda batch: None)
    return Ceiling("consume only", count, time.monotonic() - began)


def parse_and_total(bootstrap: str, topic: str, partitions: int) -> Ceiling:
    totals: dict[bytes, int] = {}
    loads = orjson.loads

    def add(batch: list[Message]) -> None:
        for message in batch:
            key = message.key()
            totals[key] = totals.get(key, 0) + loads(message.value())["amount"]  # type: ignore[arg-type,index]

    began = time.monotonic()
    count = _consume_all(bootstrap, topic, partitions, add)
    return Ceiling("consume + JSON + in-memory total", count, time.monotonic() - began, totals)


def with_changelog(bootstrap: str, topic: str, partitions: int, changelog: str, commit_interval: float) -> Ceiling:
    totals: dict[bytes, int] = {}
    changed: set[bytes] = set()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
    loads, dumps = orjson.loads, orjson.dumps
    last_commit = time.monotonic()

    def commit() -> None:
        for key in changed:
            _produce(producer, changelog, key, dumps(totals[key]))
        changed.clear()
        if producer.flush(60):
            raise SystemExit(f"FAILED: changelog records to {changelog} were not delivered within 60 s")

    def add(batch: list[Message]) -> None:
        nonlocal last_commit
        for message in batch:
            key = message.key()
            totals[key] = totals.get(key, 0) + loads(message.value())["amount"]  # type: ignore[arg-type,index]
            changed.add(key)  # type: ignore[arg-type]
        if time.monotonic() - last_commit >= commit_interval:
            commit()
            last_commit = time.monotonic()

    began = time.monotonic()
    count = _consume_all(bootstrap, topic, partitions, add)
    commit()
    return Ceiling("the same + changelog records per commit", count, time.monotonic() - began, totals)


def _produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.05)
