"""The example deployment: two stateful apps on one topic of orders, in RocksDB state stores.

`./scripts/run-example` serves it in the Dagster UI (workspace.yaml points here). It holds:
- `generate_orders`, a job (scheduled every minute) that writes random orders to the `orders` topic,
  timestamped over the last minute, and sends some of them twice (as a retrying producer would);
- the app `order-totals`: a running total per customer in the store `totals`, with big totals sent
  to `order-totals-big`;
- the app `order-counts`: drops orders already seen (their ids are kept ten minutes in the expiring
  store `seen`), then counts each customer's orders per minute of event time (the window store
  `per_minute`) and sends each minute's count, once it is final, to `order-counts-per-minute`;
- everything `build_stateful_definitions` makes for them: topic and state assets with checks, the
  provision / worker / restore / clear-state jobs, worker schedules and the lag and rebalance
  sensors, all switched on so a newcomer sees data move.

Kafka is the cluster named by KAFKA_BOOTSTRAP_SERVERS; state lives in DAGSTER_STATEFUL_STATE_DIR and
snapshots (built daily by Spark, or from the UI) in DAGSTER_STATEFUL_SNAPSHOT_ROOT.
"""

import os
import random
import time
import uuid
from datetime import timedelta

import orjson
from dagster import (
    Config,
    DefaultScheduleStatus,
    Definitions,
    EnvVar,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from dagster_stateful import KafkaResource, StateStoreResource, build_stateful_definitions
from dagster_stateful.core import App, Count, State, Store

ORDERS_TOPIC = "orders"
ORDERS_PARTITIONS = 6


def add_to_total(order: dict, state: State) -> dict:
    total = round(state.get("total", 0.0) + order["amount"], 2)
    state.set("total", total)
    state.set("orders", state.get("orders", 0) + 1)
    return {"customer": order["customer"], "total": total}


order_totals = App(
    name="order-totals",
    source=ORDERS_TOPIC,
    stores=["totals"],
    output="order-totals-big",
    on_error="dead-letter",
    commit_interval=2.0,
)
order_totals.to_topic(
    order_totals.dataframe().apply(add_to_total, stateful=True).filter(lambda result: result["total"] > 1000)
)


def first_sighting(order: dict, seen: State) -> bool:
    """True the first time an order id comes by (within the store's ttl): later copies are dropped."""
    if seen.exists(order["id"]):
        return False
    seen.set(order["id"], True)
    return True


order_counts = App(
    name="order-counts",
    source=ORDERS_TOPIC,
    stores=[Store("seen", ttl=timedelta(minutes=10)), "per_minute"],
    output="order-counts-per-minute",
    on_error="dead-letter",
    commit_interval=2.0,
)
order_counts.to_topic(
    order_counts.dataframe()
    .filter(first_sighting, store="seen")
    .tumbling_window(timedelta(minutes=1), grace=timedelta(seconds=10), store="per_minute")
    .aggregate(Count())
    .final()
)


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


defs = Definitions.merge(
    build_stateful_definitions(
        [order_totals, order_counts],
        source_partitions=ORDERS_PARTITIONS,
        kafka=KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS")),
        state_store=StateStoreResource(
            state_dir=os.environ.get("DAGSTER_STATEFUL_STATE_DIR", ".dagster-stateful/state"),
            snapshot_root=os.environ.get("DAGSTER_STATEFUL_SNAPSHOT_ROOT", ".dagster-stateful/snapshots"),
        ),
        worker_every_minutes=1,
        automation_running=True,
        lag_threshold=500,
    ),
    Definitions(
        jobs=[generate_orders],
        schedules=[
            ScheduleDefinition(
                name="generate_orders_every_minute",
                job=generate_orders,
                cron_schedule="* * * * *",
                default_status=DefaultScheduleStatus.RUNNING,
            )
        ],
    ),
)
