"""A foreign-key join's position in its right table against the worker's copy of it, with a real
broker and a real copy (no worker loop): a task partition taken up with a committed position
ahead of the copy (committed by a worker whose copy had read further) first reads the copy up to
it; one behind the copy (after a crash or a deleted state directory) reads the right table's
records in between again, and takes in exactly the keys they updated; one never committed starts
where the copy stands; and what the copy applies next reaches every held partition."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from confluent_kafka import Producer
from support.kafka_helpers import create_topic

from dagster_stateful.core import App
from dagster_stateful.core.config import ErrorPolicy
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.worker.foreign_key_joins import ForeignKeyJoins
from dagster_stateful.core.processing.worker.global_tables import GlobalTables
from dagster_stateful.core.state.commit_metadata import foreign_key_entry

COMPACTED = {"cleanup.policy": "compact"}


def produce(bootstrap: str, topic: str, records: list[tuple[str, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, tier in records:
        producer.produce(topic, key=key, value=orjson.dumps({"tier": tier}))
    assert producer.flush(30) == 0


def right_side(bootstrap: str, customers: str, state_dir: Path) -> tuple[App, GlobalTables, ForeignKeyJoins]:
    app = App(
        name="fk-positions", source="orders", output="joined", stores=["rows"], state_dir=state_dir, kafka=bootstrap
    )
    table = app.global_table(customers)
    app.dataframe().table_join(table, on="customer")
    frame = app.dataframe()
    assert frame.stream_join is not None
    bad_input = BadInputHandler(ErrorPolicy.RAISE, lambda *record: None, app.config.dead_letter_topic)
    deadline = Deadline(time.monotonic() + 60)
    tables = GlobalTables([table], app.config, app.kafka, state_dir / "app", bad_input)
    joins = ForeignKeyJoins(
        frame.stream_join, (), app.config, app.kafka, bad_input, lambda *sent: None, deadline, tables
    )
    tables.bootstrap(deadline)
    return app, tables, joins


def test_a_partition_ahead_of_the_copy_reads_the_copy_up_to_it_and_one_behind_reads_the_keys_in_between(
    kafka_bootstrap, unique_name, tmp_path
):
    customers = unique_name("customers")
    create_topic(kafka_bootstrap, customers, 2, COMPACTED)
    produce(kafka_bootstrap, customers, [(f"c{i}", i) for i in range(10)])
    app, tables, joins = right_side(kafka_bootstrap, customers, tmp_path)
    at_bootstrap = tables.position(customers)
    assert sum(at_bootstrap.values()) == 10
    entries = {right: foreign_key_entry(customers, right) for right in at_bootstrap}  # the table is named as its topic

    fresh = joins.open(0, {})
    assert fresh.position == at_bootstrap and not fresh.behind, "never committed: it starts where the copy stands"

    produce(kafka_bootstrap, customers, [("c3", 30), ("c4", 40), ("c3", 31)])
    ends = {right: high for right, (_, high) in app.kafka.watermarks(customers, list(at_bootstrap)).items()}
    ahead = joins.open(1, {entries[right]: ends[right] for right in ends})
    assert tables.position(customers) == ends, "the copy was read up to the committed position first"
    assert ahead.position == ends and not ahead.behind
    assert fresh.behind and set(fresh.pending) == {b"c3", b"c4"}, "what the copy applied reaches every held partition"
    assert orjson.loads(fresh.pending[b"c3"].value()) == {"tier": 31}, "the key's latest record"

    joins.close(1)
    behind = joins.open(1, {entries[right]: offset for right, offset in at_bootstrap.items()})
    assert behind.behind and not behind.known
    read_again = joins.updated_between(behind.position, behind.target)
    assert {key: orjson.loads(record.value()) for key, record in read_again.items()} == {
        b"c3": {"tier": 31},
        b"c4": {"tier": 40},
    }
    tables.close_all(5)
    joins.close_all(5)
