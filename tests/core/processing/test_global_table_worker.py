"""Global tables in a worker, against a real broker with the table's topic compacted as fast as Kafka
allows: orders joined with their customer's profile (left and inner), and totalled per tier through
`group_by` exactly once; the local copy resumes where it stopped, follows updates, and is rebuilt
from the topic alone when the disk is lost; a table record that does not decode goes to the error
policy with its position; a table topic that is missing or not compacted is refused at start."""

from __future__ import annotations

import shutil

import orjson
import pytest
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce, read_committed, read_messages

from dagster_stateful.core import App, Sum
from dagster_stateful.errors import ProcessingError, TopicMismatchError, TopicMissingError

PARTITIONS = 3
CUSTOMERS = 60
TIERS = ("bronze", "silver", "gold")
COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
}


def profiles(rounds: int, start: int = 0) -> list[tuple[bytes, bytes | None]]:
    """Each customer's profile, rewritten `rounds` times (its tier moves on each time); every 7th
    customer is deleted in the last round (a tombstone)."""
    records: list[tuple[bytes, bytes | None]] = []
    for round_ in range(start, start + rounds):
        for customer in range(CUSTOMERS):
            tier = TIERS[(customer + round_) % len(TIERS)]
            records.append((f"c{customer}".encode(), orjson.dumps({"tier": tier, "round": round_})))
    records += [(f"c{customer}".encode(), None) for customer in range(0, CUSTOMERS, 7)]
    return records


def orders(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """Orders keyed by order id; some name a customer no profile has (c-unknown)."""
    return [
        (
            f"o{i}".encode(),
            orjson.dumps({"order": i, "customer": f"c{i % CUSTOMERS}" if i % 11 else "c-unknown", "amount": 1 + i % 5}),
        )
        for i in range(start, start + count)
    ]


def latest_profiles(bootstrap: str, topic: str) -> dict[str, dict]:
    """The table recomputed from its topic: the latest value of each key, tombstones deleting."""
    table: dict[str, dict] = {}
    for message in sorted(read_messages(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        if message.value() is None:
            table.pop(message.key().decode(), None)
        else:
            table[message.key().decode()] = orjson.loads(message.value())
    return table


def enriched_outputs(bootstrap: str, topic: str) -> dict[int, str | None]:
    """Order -> the tier it was sent with (None: sent without one), each order once."""
    seen: dict[int, str | None] = {}
    for message in read_committed(bootstrap, topic):
        value = orjson.loads(message.value())
        assert value["order"] not in seen, f"order {value['order']} sent twice"
        seen[value["order"]] = value.get("tier")
    return seen


@pytest.fixture
def topics(kafka_bootstrap, unique_name):
    customers, source = unique_name("customers"), unique_name("orders")
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce(kafka_bootstrap, customers, profiles(rounds=4))
    return customers, source


def enriching_app(bootstrap, customers, source, state_dir, name, how="left", **settings) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-enriched",
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
        **settings,
    )
    table = app.global_table(customers, name="customers")
    app.to_topic(app.dataframe().join(table, on="customer", how=how, on_merge="keep-left"))
    return app


@pytest.mark.parametrize(("how", "guarantee"), [("left", "at-least-once"), ("inner", "exactly-once")])
def test_orders_are_enriched_with_the_latest_profile_and_follow_its_updates(
    kafka_bootstrap, unique_name, topics, tmp_path, how, guarantee
):
    customers, source = topics
    name = unique_name("enrich")
    create_topic(kafka_bootstrap, f"{name}-enriched", PARTITIONS)
    app = enriching_app(kafka_bootstrap, customers, source, tmp_path, name, how, processing_guarantee=guarantee)
    produce(kafka_bootstrap, source, orders(500))

    first = app.run_worker(max_seconds=120)

    table = latest_profiles(kafka_bootstrap, customers)
    expected = {
        order["order"]: table.get(order["customer"], {}).get("tier")
        for order in (orjson.loads(value) for _, value in orders(500))
        if how == "left" or order["customer"] in table
    }
    assert first.stop_reason == "caught_up" and enriched_outputs(kafka_bootstrap, f"{name}-enriched") == expected
    assert None in expected.values() if how == "left" else None not in expected.values()

    produce(kafka_bootstrap, customers, profiles(rounds=1, start=4))  # every tier moves on
    produce(kafka_bootstrap, source, orders(300, start=500))
    second = app.run_worker(max_seconds=120)  # the local copy resumes where it stopped

    table = latest_profiles(kafka_bootstrap, customers)
    for order in (orjson.loads(value) for _, value in orders(300, start=500)):
        if how == "left" or order["customer"] in table:
            expected[order["order"]] = table.get(order["customer"], {}).get("tier")
    assert second.stop_reason == "caught_up" and enriched_outputs(kafka_bootstrap, f"{name}-enriched") == expected


def test_a_lost_copy_is_rebuilt_from_the_compacted_topic_and_tiers_are_totalled_exactly_once(
    kafka_bootstrap, unique_name, topics, tmp_path
):
    """The example's shape: orders joined with their customer's tier, re-keyed by tier, summed."""
    customers, source = topics
    name = unique_name("tiers")
    app = App(
        name=name,
        source=source,
        output=f"{name}-totals",
        stores=["totals"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        processing_guarantee="exactly-once",
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    table = app.global_table(customers, name="customers")
    per_tier = app.dataframe().join(table, on="customer", on_merge="keep-left").group_by("tier")
    app.to_topic(per_tier.aggregate(Sum("amount"), name="total"))
    produce(kafka_bootstrap, source, orders(600))
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"

    shutil.rmtree(tmp_path / name)  # the disk is lost: the table comes back from its topic alone
    produce(kafka_bootstrap, source, orders(300, start=600))
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"

    profile = latest_profiles(kafka_bootstrap, customers)
    expected: dict[str, int] = {}
    for _, value in orders(900):
        order = orjson.loads(value)
        if order["customer"] in profile:
            tier = profile[order["customer"]]["tier"]
            expected[tier] = expected.get(tier, 0) + order["amount"]
    with app.read_state("totals") as reader:
        assert {entry.message_key: entry.value for entry in reader.items()} == expected
    last: dict[str, int] = {}
    for message in sorted(read_committed(kafka_bootstrap, f"{name}-totals"), key=lambda m: (m.partition(), m.offset())):
        last[message.key().decode()] = orjson.loads(message.value())
    assert last == expected


def test_a_table_record_that_does_not_decode_is_dead_lettered_or_stops_the_worker_naming_it(
    kafka_bootstrap, unique_name, topics, tmp_path
):
    customers, source = topics
    produce(kafka_bootstrap, customers, [(b"c1", b"not json")])
    [bad] = [m for m in read_messages(kafka_bootstrap, customers) if m.value() == b"not json"]
    produce(kafka_bootstrap, source, orders(50))
    strict = enriching_app(kafka_bootstrap, customers, source, tmp_path / "a", unique_name("strict"))

    with pytest.raises(ProcessingError, match=rf"{customers}\[{bad.partition()}\] offset {bad.offset()}"):
        strict.run_worker(max_seconds=60)

    name = unique_name("lenient")
    create_topic(kafka_bootstrap, f"{name}-enriched", PARTITIONS)
    lenient = enriching_app(kafka_bootstrap, customers, source, tmp_path / "b", name, on_error="dead-letter")
    report = lenient.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.dead_lettered == 1
    [letter] = read_messages(kafka_bootstrap, lenient.dead_letter_topic)
    headers = {key: value.decode() for key, value in letter.headers()}
    assert (headers["x-dagster-stateful-source-topic"], letter.value()) == (customers, b"not json")
    assert headers["x-dagster-stateful-source-offset"] == str(bad.offset())


def test_a_table_topic_that_is_missing_or_not_compacted_is_refused_at_start(kafka_bootstrap, unique_name, tmp_path):
    source, plain = unique_name("orders"), unique_name("plain")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, plain, PARTITIONS)
    missing = enriching_app(kafka_bootstrap, unique_name("nowhere"), source, tmp_path, unique_name("a"))
    with pytest.raises(TopicMissingError, match=r"global table topic .* does not exist"):
        missing.run_worker(max_seconds=30)
    deleting = enriching_app(kafka_bootstrap, plain, source, tmp_path, unique_name("b"))
    with pytest.raises(TopicMismatchError, match=r"cleanup\.policy=compact"):
        deleting.run_worker(max_seconds=30)
