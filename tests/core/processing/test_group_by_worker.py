"""Re-keying (`group_by`) in a worker, against a real broker with aggressive changelog compaction:
orders keyed by customer are totalled per region through the app's repartition topic, and the
totals (in the store, in the output topic, after a restore from the changelog alone) are those
recomputed from the source topic, under both guarantees; what the group consumed and committed is
purged from the repartition topic; a record without the field goes to the error policy."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce, read_committed, read_messages, wait_for

from dagster_stateful.core import Aggregate, App, Sum, WorkerReport

PARTITIONS = 3
REGIONS = 7
CUSTOMERS = 120
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}


def region_orders(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """Orders keyed by customer; each customer lives in one region."""
    orders = []
    for i in range(start, start + count):
        customer = i % CUSTOMERS
        order = {"customer": f"c{customer}", "region": f"r{customer % REGIONS}", "amount": 1 + i % 9}
        orders.append((f"c{customer}".encode(), orjson.dumps(order)))
    return orders


def totals_per_region(bootstrap: str, source: str) -> dict[str, int]:
    """Recomputed from the source topic alone (records without a region left out)."""
    totals: dict[str, int] = {}
    for message in read_messages(bootstrap, source):
        order = orjson.loads(message.value())
        if "region" in order:
            totals[order["region"]] = totals.get(order["region"], 0) + order["amount"]
    return totals


def orders_per_region(bootstrap: str, source: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in read_messages(bootstrap, source):
        order = orjson.loads(message.value())
        if "region" in order:
            counts[order["region"]] = counts.get(order["region"], 0) + 1
    return counts


def region_app(
    bootstrap: str, source: str, state_dir: Path, name: str, guarantee: str, columnar: bool, slow: bool = False
) -> App:
    """Totals per region, from orders keyed by customer: `group_by("region")`, then `Sum("amount")`
    (columnar, each changed total once per commit) or a per-message `Aggregate` (every new total);
    `slow`: the filter before group_by takes 2 ms an order."""
    app = App(
        name=name,
        source=source,
        output=f"{name}-totals",
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        on_error="dead-letter",
        repartition_purge_interval=0.5,
        commit_every=400,
        **FAST_COMMITS,
    )
    regions = app.dataframe().filter(slow_positive if slow else positive).group_by("region")
    if columnar:
        app.to_topic(regions.aggregate(Sum("amount"), name="total"))
    else:
        total = Aggregate(lambda: 0, lambda running, order: running + order["amount"])
        app.to_topic(regions.aggregate(total, name="total", emit="per-message"))
    return app


def positive(order: dict) -> bool:
    return order["amount"] > 0


def slow_positive(order: dict) -> bool:
    time.sleep(0.002)
    return order["amount"] > 0


def totals_in_store(app: App) -> dict[str, int]:
    with app.read_state("totals") as reader:
        return {entry.message_key: entry.value for entry in reader.items() if entry.state_key == "total"}


def final_outputs(bootstrap: str, topic: str) -> dict[str, int]:
    """The last total each region was sent with (a read_committed reader's view)."""
    last: dict[str, int] = {}
    for message in sorted(read_committed(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        last[message.key().decode()] = orjson.loads(message.value())
    return last


def setup(bootstrap: str, unique_name, orders: list[tuple[bytes, bytes]]) -> tuple[str, str]:
    source, name = unique_name("orders"), unique_name("regions")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, f"{name}-totals", PARTITIONS)
    produce(bootstrap, source, orders)
    return source, name


@pytest.mark.parametrize(("guarantee", "columnar"), [("at-least-once", True), ("exactly-once", False)])
def test_totals_per_new_key_equal_the_source_and_survive_a_lost_disk(
    kafka_bootstrap, unique_name, tmp_path, guarantee, columnar
):
    source, name = setup(kafka_bootstrap, unique_name, region_orders(3_000))
    app = region_app(kafka_bootstrap, source, tmp_path / "a", name, guarantee, columnar)

    first = app.run_worker(max_seconds=120)

    assert first.stop_reason == "caught_up" and first.total_lag == 0
    assert sum(first.rekeyed.values()) == 3_000
    assert first.total_processed == 3_000
    expected = totals_per_region(kafka_bootstrap, source)
    assert totals_in_store(app) == expected
    assert final_outputs(kafka_bootstrap, f"{name}-totals") == expected

    produce(kafka_bootstrap, source, region_orders(1_500, start=3_000))
    shutil.rmtree(tmp_path / "a")  # the disk is lost: the totals come back from the changelog alone
    second = app.run_worker(max_seconds=120)

    assert second.stop_reason == "caught_up" and second.total_lag == 0
    expected = totals_per_region(kafka_bootstrap, source)
    assert totals_in_store(app) == expected
    assert final_outputs(kafka_bootstrap, f"{name}-totals") == expected
    if not columnar:  # every order's new total, each once for a read_committed reader
        sent: dict[str, list[int]] = {}
        for message in read_committed(kafka_bootstrap, f"{name}-totals"):
            sent.setdefault(message.key().decode(), []).append(orjson.loads(message.value()))
        assert {region: len(totals) for region, totals in sent.items()} == orders_per_region(kafka_bootstrap, source)
        assert all(len(set(totals)) == len(totals) for totals in sent.values())


def test_the_repartition_topic_is_created_like_the_source_and_purged_once_committed(
    kafka_bootstrap, unique_name, tmp_path
):
    source, name = setup(kafka_bootstrap, unique_name, region_orders(2_000))
    app = region_app(kafka_bootstrap, source, tmp_path, name, "at-least-once", columnar=True)
    repartition = f"{name}-region-repartition"
    assert app.config.repartition_topic == repartition

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = admin.list_topics(repartition, timeout=10).topics[repartition]
    assert len(topic.partitions) == PARTITIONS
    plan = app.provisioning_plan()
    assert plan.check(repartition).spec.config["cleanup.policy"] == "delete"

    def purged() -> bool:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "purge-check"})
        try:
            marks = [consumer.get_watermark_offsets(TopicPartition(repartition, p), timeout=10) for p in range(3)]
        finally:
            consumer.close()
        committed = app.kafka.committed_offsets(app.consumer_group, repartition, range(PARTITIONS))
        return sum(high for _, high in marks) == 2_000 and all(low == committed[p] for p, (low, _) in enumerate(marks))

    wait_for(purged, 30, "the repartition topic purged up to the committed offsets")


def test_a_record_without_the_field_is_dead_lettered_with_its_source_position(kafka_bootstrap, unique_name, tmp_path):
    orders = region_orders(600)
    orders.insert(100, (b"c-odd", orjson.dumps({"customer": "c-odd", "amount": 5})))
    source, name = setup(kafka_bootstrap, unique_name, orders)
    app = region_app(kafka_bootstrap, source, tmp_path, name, "at-least-once", columnar=True)

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.dead_lettered == 1
    assert totals_in_store(app) == totals_per_region(kafka_bootstrap, source)
    [letter] = read_messages(kafka_bootstrap, app.dead_letter_topic)
    headers = {key: value.decode() for key, value in letter.headers()}
    [odd] = [message for message in read_messages(kafka_bootstrap, source) if message.key() == b"c-odd"]
    assert letter.key() == b"c-odd"
    assert (headers["x-dagster-stateful-source-topic"], headers["x-dagster-stateful-source-partition"]) == (
        source,
        str(odd.partition()),
    )
    assert headers["x-dagster-stateful-source-offset"] == str(odd.offset())
    assert "region" in headers["x-dagster-stateful-error-message"]


def test_two_workers_share_both_topics_across_a_rebalance_exactly_once(kafka_bootstrap, unique_name, tmp_path):
    """B joins while A re-keys (a slow step before group_by): both topics' partitions move, and every
    order's new total still appears once for a read_committed reader, the totals exact."""
    source, name = setup(kafka_bootstrap, unique_name, region_orders(4_000))
    apps = {
        label: region_app(kafka_bootstrap, source, tmp_path / label, name, "exactly-once", columnar=False, slow=True)
        for label in ("a", "b")
    }
    workers = {label: app.worker(max_seconds=180) for label, app in apps.items()}
    results: dict[str, WorkerReport | BaseException] = {}

    def run(label: str) -> None:
        try:
            results[label] = workers[label].run()
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertions below
            results[label] = error

    thread_a = threading.Thread(target=run, args=("a",))
    thread_a.start()
    wait_for(lambda: sum(workers["a"].report.rekeyed.values()) >= 300, 60, "worker A to get going")
    thread_b = threading.Thread(target=run, args=("b",))
    thread_b.start()
    thread_a.join(200)
    thread_b.join(200)

    report_a, report_b = results["a"], results["b"]
    assert not isinstance(report_a, BaseException), report_a
    assert not isinstance(report_b, BaseException), report_b
    b_processed = sum(report_b.rekeyed.values()) + report_b.total_processed
    assert report_a.rebalances >= 2 and b_processed > 0, f"B took over partitions: A {report_a}, B {report_b}"
    final = apps["a"].run_worker(max_seconds=120)  # A alone: takes everything back, restores what B changed
    assert final.stop_reason == "caught_up" and final.total_lag == 0
    expected = totals_per_region(kafka_bootstrap, source)
    assert totals_in_store(apps["a"]) == expected
    sent: dict[str, list[int]] = {}
    for message in read_committed(kafka_bootstrap, f"{name}-totals"):
        sent.setdefault(message.key().decode(), []).append(orjson.loads(message.value()))
    assert {region: len(totals) for region, totals in sent.items()} == orders_per_region(kafka_bootstrap, source)
    assert {region: max(totals) for region, totals in sent.items()} == expected
