"""The example's four stateful apps, all reading the topic `orders`.

- `order_totals`: a running total per customer in the store `totals`, with big totals sent to
  `order-totals-big`;
- `order_counts`: drops orders already seen (their ids are kept ten minutes in the expiring store
  `seen`), then counts each customer's orders per minute of event time (the window store
  `per_minute`) and sends each minute's count, once it is final, to `order-counts-per-minute`;
- `order_tiers`: enriches each order with its customer's tier from the global table `customers`
  (the compacted topic of customer profiles), re-keys the orders by tier (`group_by`) and totals
  them per tier in the store `per_tier`, sending each changed total to `order-totals-per-tier`.

- `order_sessions`: keeps each customer's shopping sessions (orders no two of which are more than
  20 s apart in event time) in the session store `sessions`, merging two sessions when an order
  bridges them, and sends each session's total, once it is final, to `order-sessions`.

`defs/order_apps/defs.yaml` names them (`example.apps:order_totals`, `example.apps:order_counts`,
`example.apps:order_tiers`, `example.apps:order_sessions`).
"""

from datetime import timedelta

from dagster_stateful.core import App, Count, State, Store, Sum

ORDERS_TOPIC = "orders"
ORDERS_PARTITIONS = 6  # `source_partitions` in defs/order_apps/defs.yaml
CUSTOMERS_TOPIC = "customers"
"""Each customer's profile, `{"tier": ...}`, keyed by customer (compacted: the latest profile stays)."""
TIERS = ("bronze", "silver", "gold")


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


order_tiers = App(
    name="order-tiers",
    source=ORDERS_TOPIC,
    stores=["per_tier"],
    output="order-totals-per-tier",
    on_error="dead-letter",
    commit_interval=2.0,
)
customers = order_tiers.global_table(CUSTOMERS_TOPIC, name="customers")
order_tiers.to_topic(
    order_tiers.dataframe()
    .join(customers, on="customer", on_merge="keep-left")
    .group_by("tier")
    .aggregate(Sum("amount"), name="total")
)


SESSION_GAP = timedelta(seconds=20)

order_sessions = App(
    name="order-sessions",
    source=ORDERS_TOPIC,
    stores=["sessions"],
    output="order-sessions",
    on_error="dead-letter",
    commit_interval=2.0,
)
order_sessions.to_topic(
    order_sessions.dataframe()
    .session_window(SESSION_GAP, grace=timedelta(seconds=10), store="sessions")
    .aggregate(Sum("amount"), name="total")
    .final()
)
