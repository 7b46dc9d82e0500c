"""The order generator: a job (scheduled every minute) that writes random orders to the `orders` topic,
timestamped over the last minute, and sends some of them twice (as a retrying producer would)."""

import random
import time
import uuid

import orjson
from dagster import Config, DefaultScheduleStatus, OpExecutionContext, ScheduleDefinition, job, op
from pydantic import Field

from dagster_stateful import KafkaResource
from example.apps import ORDERS_PARTITIONS, ORDERS_TOPIC


class GenerateOrdersConfig(Config):
    count: int = Field(default=500, description="How many orders to write.")
    customers: int = Field(default=50, description="How many distinct customers (message keys).")
    spread_seconds: int = Field(default=60, description="Orders are timestamped over this many seconds until now.")
    duplicates: float = Field(default=0.05, description="The share of orders sent twice.")


@op
def write_orders(context: OpExecutionContext, config: GenerateOrdersConfig, kafka: KafkaResource) -> None:
    clients = kafka.clients()
    if clients.partition_count(ORDERS_TOPIC) is None:
        clients.create_topic(ORDERS_TOPIC, ORDERS_PARTITIONS, 1, {})
    producer = clients.producer({"partitioner": "murmur2_random", "linger.ms": 20})
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
    context.add_output_metadata({"orders": config.count, "messages_written": sent, "topic": ORDERS_TOPIC})


@job(
    description="Write random orders to the `orders` topic (creating it with 6 partitions if missing), some of them "
    "twice."
)
def generate_orders():
    write_orders()


generate_orders_every_minute = ScheduleDefinition(
    name="generate_orders_every_minute",
    job=generate_orders,
    cron_schedule="* * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
)
