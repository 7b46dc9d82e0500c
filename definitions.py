"""The example deployment: per-customer order totals, kept in a RocksDB state store.

`./scripts/run-example` serves it in the Dagster UI (workspace.yaml points here). It holds:
- `generate_orders`, a job (scheduled every minute) that writes random orders to the `orders` topic;
- the app `order-totals`: a running total per customer in the store `totals`, with big totals sent
  to `order-totals-big`;
- everything `build_stateful_definitions` makes for it: topic and state assets with checks, the
  provision / worker / restore / clear-state jobs, a worker schedule and the lag and rebalance
  sensors, all switched on so a newcomer sees data move.

Kafka is the cluster named by KAFKA_BOOTSTRAP_SERVERS; state lives in DAGSTER_STATEFUL_STATE_DIR and
snapshots (built daily by Spark, or from the UI) in DAGSTER_STATEFUL_SNAPSHOT_ROOT.
"""

import os
import random

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
from dagster_stateful.core import App, State

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


class GenerateOrdersConfig(Config):
    count: int = Field(default=500, description="How many orders to write.")
    customers: int = Field(default=50, description="How many distinct customers (message keys).")


@op
def write_orders(context: OpExecutionContext, config: GenerateOrdersConfig, kafka: KafkaResource) -> None:
    clients = kafka.clients()
    if clients.partition_count(ORDERS_TOPIC) is None:
        clients.create_topic(ORDERS_TOPIC, ORDERS_PARTITIONS, 1, {})
    producer = clients.producer({"partitioner": "murmur2_random", "linger.ms": 20})
    for _ in range(config.count):
        customer = f"customer-{random.randrange(config.customers):03d}"
        order = {"customer": customer, "amount": round(random.uniform(1, 120), 2)}
        producer.produce(ORDERS_TOPIC, key=customer.encode(), value=orjson.dumps(order))
        producer.poll(0)
    undelivered = producer.flush(30)
    if undelivered:
        raise RuntimeError(f"{undelivered} orders were not acknowledged by Kafka")
    context.add_output_metadata({"orders_written": config.count, "topic": ORDERS_TOPIC})


@job(description="Write random orders to the `orders` topic (creating it with 6 partitions if missing).")
def generate_orders():
    write_orders()


defs = Definitions.merge(
    build_stateful_definitions(
        order_totals,
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
