"""A broker outage: admin calls wait it out (with backoff, up to `admin_timeout_seconds`) and answer
right once the broker is back on the same port; past the deadline they raise a retriable
`KafkaOperationError` saying how long the brokers were unreachable. A commit waits for its records
up to the producer's `delivery.timeout.ms`; past it, it fails with `DeliveryError` and commits
nothing. Runs a broker of its own, which it stops and starts again."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.kafka_helpers import create_topic, produce, wait_for

from dagster_stateful.core import AppConfig, JsonSerde
from dagster_stateful.core.kafka.clients import ATTEMPT_TIMEOUT, KafkaClients
from dagster_stateful.core.processing.commit.committer import FLUSH_MARGIN_SECONDS, Committer
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker, delivery_timeout_seconds
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import DeliveryError, KafkaOperationError
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker

pytestmark = pytest.mark.integration

SHORT_DEADLINE = 3.0
LONG_DEADLINE = 180.0


class RetrySeen(logging.Handler):
    """Set once the Kafka adapter logs a retry: the call in the other thread has met the outage."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "Retrying" in record.getMessage() or "has failed" in record.getMessage():
            self.seen.set()


def same_ports(home: Path) -> BrokerSettings:
    """The ports the broker in `home` listened on, to start it again where clients look for it."""
    state = json.loads((home / "broker.json").read_text())
    return BrokerSettings(
        port=int(state["bootstrap_servers"].rsplit(":", 1)[1]), controller_port=state["controller_port"]
    )


def clients_of(bootstrap: str, admin_timeout_seconds: float) -> KafkaClients:
    return KafkaClients({"bootstrap.servers": bootstrap, "log_level": 0}, admin_timeout_seconds=admin_timeout_seconds)


def answers(clients: KafkaClients) -> dict[int, tuple[int, int]] | None:
    """The watermarks of orders, or None while `clients` cannot reach the broker in its deadline."""
    try:
        return clients.watermarks("orders", [0, 1])
    except KafkaOperationError:
        return None


def read_watermarks(clients: KafkaClients, outcome: dict[str, object]) -> None:
    try:
        outcome["marks"] = clients.watermarks("orders", [0, 1])
    except Exception as error:  # noqa: BLE001 - handed to the test thread, which asserts on it
        outcome["error"] = error


def test_watermarks_wait_out_a_broker_restart_and_give_up_after_the_deadline(tmp_path):
    home = tmp_path / "kafka"
    broker = LocalKafkaBroker(home)
    bootstrap = broker.start(tie_to_parent=True)
    retries = RetrySeen()
    adapter_log = logging.getLogger("dagster_stateful.core.kafka.retrying")
    adapter_log.addHandler(retries)
    previous_level = adapter_log.level
    adapter_log.setLevel(logging.DEBUG)
    try:
        create_topic(bootstrap, "orders", partitions=2)
        produce(bootstrap, "orders", [(f"c{i}".encode(), b"{}") for i in range(25)])
        patient, impatient = clients_of(bootstrap, LONG_DEADLINE), clients_of(bootstrap, SHORT_DEADLINE)
        expected = patient.watermarks("orders", [0, 1])
        assert sum(high for _, high in expected.values()) == 25
        # A loaded machine may take longer than the short deadline to connect a new client: only
        # a client that has answered once is certain to meet the outage, not its own start.
        wait_for(lambda: answers(impatient) == expected, 60, "the impatient client to answer")
        restart = same_ports(home)
        broker.stop()

        began = time.monotonic()
        with pytest.raises(KafkaOperationError) as raised:
            impatient.watermarks("orders", [0, 1])
        waited = time.monotonic() - began
        error = raised.value
        assert error.retriable, str(error)
        assert f"unreachable for {SHORT_DEADLINE:g} s" in str(error) and bootstrap in str(error), str(error)
        assert "orders" in str(error) and error.code is not None, str(error)
        assert SHORT_DEADLINE <= waited < SHORT_DEADLINE + ATTEMPT_TIMEOUT + 5, waited

        outcome: dict[str, object] = {}
        reader = threading.Thread(target=read_watermarks, args=(patient, outcome))
        retries.seen.clear()
        reader.start()
        wait_for(retries.seen.is_set, 60, "the watermarks call to meet the stopped broker")
        assert reader.is_alive(), "the call waits for the broker instead of failing"

        broker = LocalKafkaBroker(home, restart)
        assert broker.start(tie_to_parent=True) == bootstrap
        reader.join(timeout=LONG_DEADLINE)

        assert not reader.is_alive(), "the watermarks call returned"
        assert outcome.get("marks") == expected, outcome
    finally:
        adapter_log.removeHandler(retries)
        adapter_log.setLevel(previous_level)
        broker.stop()


def test_a_commit_during_an_outage_longer_than_the_delivery_timeout_fails_and_commits_nothing(tmp_path):
    home = tmp_path / "kafka"
    broker = LocalKafkaBroker(home)
    bootstrap = broker.start(tie_to_parent=True)
    config = AppConfig(
        name="totals", source="orders", stores=("totals",), producer_config={"delivery.timeout.ms": 2000}
    )
    create_topic(bootstrap, config.source)
    create_topic(bootstrap, config.changelog_topic("totals"), config={"cleanup.policy": "compact"})
    produce(bootstrap, config.source, [(b"a", b"{}")])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": config.consumer_group, "log_level": 0})
    consumer.assign([TopicPartition(config.source, 0)])
    tracker = DeliveryTracker()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "on_delivery": tracker, "log_level": 0})
    timeout = delivery_timeout_seconds(config.producer_config)
    committer = Committer(consumer, producer, tracker, config.source, config.changelog_topics(), timeout)
    store = StateDirectory(tmp_path / "state", config).partition("totals", 0)
    store.open()
    restart = same_ports(home)
    try:
        txn = PartitionTransaction(0, {"totals": store}, JsonSerde(), committed_offset=None)
        txn.begin_message(b"a", 0)
        txn.states["totals"].set("total", 5)
        txn.accept_message(0)
        broker.stop()

        began = time.monotonic()
        with pytest.raises(DeliveryError) as raised:
            committer.commit([txn])
        waited = time.monotonic() - began

        assert timeout == 2.0 and waited < timeout + FLUSH_MARGIN_SECONDS + 5, waited
        assert "delivery.timeout.ms (2 s)" in str(raised.value) and "orders partitions [0]" in str(raised.value)
        assert store.get(message_prefix(b"a") + b"total") is None and store.source_offset is None
        broker = LocalKafkaBroker(home, restart)
        broker.start(tie_to_parent=True)
        # Retries while the restarted broker loads the group coordinator (NOT_COORDINATOR at first).
        committed = KafkaClients({"bootstrap.servers": bootstrap}).committed_offsets(
            config.consumer_group, config.source, [0]
        )
        assert committed == {0: None}, "the source offset was not committed"
    finally:
        store.close()
        consumer.close()
        broker.stop()
