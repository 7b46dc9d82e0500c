"""The order generator: a job (scheduled every minute) that writes each customer's profile (a tier, which
now and then changes) to the compacted `customers` topic, then random orders to the `orders` topic,
timestamped over the last minute, some of them twice (as a retrying producer would)."""

import random
import time
import uuid

import orjson
from confluent_kafka import Producer
from dagster import Config, DefaultScheduleStatus, OpExecutionContext, ScheduleDefinition, job, op
from pydantic import Field

from dagster_stateful import KafkaResource
from example.apps import CUSTOMERS_TOPIC, ORDERS_PARTITIONS, ORDERS_TOPIC, TIERS


class GenerateOrdersConfig(Config):
    count: int = Field(default=500, description="How many orders to write.")
    customers: int = Field(default=50, description="How many distinct customers (message keys).")
    spread_seconds: int = Field(default=60, description="Orders are timestamped over this many seconds until now.")
    duplicates: float = Field(default=0.05, description="The share of orders sent twice.")
    tier_changes: float = Field(default=0.1, description="The share of customers whose tier changes.")


@op
def write_orders(context: OpExecutionContext, config: GenerateOrdersConfig, kafka: KafkaResource) -> None:
    clients = kafka.clients()
    if clients.partition_count(CUSTOMERS_TOPIC) is None:
        clients.create_topic(CUSTOMERS_TOPIC, 1, 1, {"cleanup.policy": "compact"})
    if clients.partition_count(ORDERS_TOPIC) is None:
        clients.create_topic(ORDERS_TOPIC, ORDERS_PARTITIONS, 1, {})
    producer = clients.producer({"partitioner": "murmur2_random", "linger.ms": 20})
    changed = write_profiles(producer, config)
    now_ms = time.time_ns() // 1_000_000
    sent = 0
    for i in range(config.count):
        customer = f"customer-{random.randrange(config.customers):03d}"
        order = {"id": uuid.uuid4().hex, "customer": customer, "amount": round(random.uniform(1, 120), 2)}
        timestamp = now_ms - config.spread_seconds * 1000 * (config.count - i) // config.count
        copies = 2 if random.random() < config.duplicates else 1
        for _ in range(copies):
            producer.produce(ORDERS_TOPIC, key=customer.encode(), value=orjson.dumps(order), timestamp=timestamp)
            producer.poll(0)
        sent += copies
    undelivered = producer.flush(30)
    if undelivered:
        raise RuntimeError(f"{undelivered} orders were not acknowledged by Kafka")
    context.add_output_metadata(
        {"orders": config.count, "messages_written": sent, "topic": ORDERS_TOPIC, "tiers_changed": changed}
    )


def write_profiles(producer: Producer, config: GenerateOrdersConfig) -> int:
    """Every customer's profile: its usual tier, or another one for a `tier_changes` share of them."""
    changed = 0
    for number in range(config.customers):
        customer = f"customer-{number:03d}"
        tier = TIERS[number % len(TIERS)]
        if random.random() < config.tier_changes:
            tier, changed = random.choice(TIERS), changed + 1
        producer.produce(CUSTOMERS_TOPIC, key=customer.encode(), value=orjson.dumps({"tier": tier}))
        producer.poll(0)
    return changed


@job(
    description="Write each customer's tier to the compacted `customers` topic, then random orders to the `orders` "
    "topic (creating either if missing), some of them twice."
)
def generate_orders():
    write_orders()


generate_orders_every_minute = ScheduleDefinition(
    name="generate_orders_every_minute",
    job=generate_orders,
    cron_schedule="* * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
)
