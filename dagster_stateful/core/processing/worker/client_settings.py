"""The settings of a worker's own Kafka clients, before the app's overrides.

Owns `worker_consumer_config` (the app's consumer group, no automatic commits or offset stores,
cooperative-sticky assignment, static membership when the app names an instance id, and
`read_committed` under exactly-once) and `worker_producer_config` (idempotent, acknowledged by
every in-sync replica, Kafka's default murmur2 partitioner, delivery reports of failures only,
which the commit path collects, and a transactional id under exactly-once). A commit proves
delivery by the producer's flush (or the transaction's commit) with no failure reported, and asks
the broker where each changelog partition ends: a report per record delivered cost about a
microsecond of the worker's CPU each (bench/bench_delivery_reports.py). The app's
`consumer_config` and `producer_config` come last and win.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import FETCH_QUEUE_BACKOFF_MS
from dagster_stateful.core.processing.commit.delivery import DEFAULT_DELIVERY_TIMEOUT_MS
from dagster_stateful.core.processing.commit.transactions import transactional_config

__all__ = ["FETCH_QUEUE_BACKOFF_MS", "PARTITION_FETCH_BYTES", "worker_consumer_config", "worker_producer_config"]

PARTITION_FETCH_BYTES = 2 * 1024 * 1024
"""Bytes one fetch takes from a partition (librdkafka's default is 1 MiB): fewer, larger fetches let
a Python consumer take more small messages per second (bench/ceilings.py). Measured on the worker
(bench/bench_fetch_size.py): 1 MiB cost a quarter of the rate with 10k keys, and 5 MiB, the size
before, was no faster than 2 MiB but cost 130 MiB more at the peak."""


def worker_consumer_config(config: AppConfig, client_id: str) -> dict[str, Any]:
    return {
        "group.id": config.consumer_group,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        **({"group.instance.id": config.group_instance_id} if config.group_instance_id else {}),
        **({"isolation.level": "read_committed"} if config.exactly_once else {}),
        **config.consumer_config,
    }


def worker_producer_config(config: AppConfig, client_id: str, on_delivery: Callable[..., None]) -> dict[str, Any]:
    return {
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        "delivery.timeout.ms": DEFAULT_DELIVERY_TIMEOUT_MS,
        "on_delivery": on_delivery,
        "delivery.report.only.error": True,
        **transactional_config(config, client_id),
        **config.producer_config,
    }
