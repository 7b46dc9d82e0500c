"""A three-broker KRaft cluster started by `dagster-stateful kafka start --brokers 3`: replicated
topics, and a broker SIGKILLed while an exactly-once worker processes and commits: the worker
finishes, the store holds what its changelog holds and the totals recomputed from the source,
exactly, and the restarted broker rejoins every changelog partition's in-sync replicas. Offsets read
while a partition's leader is dead wait for the new leader instead of answering nonsense."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient
from support.core_helpers import add_to_total, expected_totals, make_orders, totals_app, totals_in_store
from support.kafka_helpers import produce, read_committed, wait_for

from dagster_stateful.core import State
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.processing.lifecycle import SHUTDOWN_GRACE_SECONDS
from dagster_stateful.core.processing.worker.loop import Worker
from dagster_stateful.core.state.keys import split_store_key
from dagster_stateful.local_kafka.cluster import LocalKafkaCluster

PARTITIONS = 3
MAX_SECONDS = 120
ELECTION_SECONDS = 60
"""How long new leaders may take to be elected after a broker is killed (its fencing takes about 10 s)."""
AFTER_ELECTION_SECONDS = 3.0
"""How long offsets are still read after the election, for clients whose metadata names the dead leader."""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagster_stateful.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalKafkaCluster]]:
    home = tmp_path_factory.mktemp("cluster")
    started = cli("kafka", "start", "--brokers", "3", "--home", str(home))
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        bootstrap = started.stdout.strip()
        assert len(bootstrap.split(",")) == 3, bootstrap
        assert cli("kafka", "status", "--home", str(home)).returncode == 0
        yield bootstrap, LocalKafkaCluster.at(home)
    finally:
        stopped = cli("kafka", "stop", "--home", str(home))
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        status = cli("kafka", "status", "--home", str(home))
        assert status.returncode == 3, status.stdout


def test_topics_of_the_cluster_have_three_replicas_and_need_two_in_sync(cluster):
    bootstrap, _ = cluster
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    kafka.create_topic("replicated", PARTITIONS, -1, {})

    layout = kafka.topic_layout("replicated")
    assert layout is not None and layout.replication_factor == 3
    assert kafka.topic_config("replicated")["min.insync.replicas"] == "2"


def slow_total(order: dict, state: State) -> dict:
    time.sleep(0.002)  # long enough a run for a broker to die in the middle of it
    return add_to_total(order, state)


def run_into(worker: Worker, outcome: dict[str, object]) -> None:
    try:
        outcome["report"] = worker.run()
    except Exception as error:  # noqa: BLE001 - asserted on by the test
        outcome["error"] = error


def led_by_live_brokers(bootstrap: str, topic: str, dead: int) -> bool:
    """Whether every partition of `topic` has a leader, and none is the `dead` broker."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return all(info.leader not in (dead, -1) for info in metadata.topics[topic].partitions.values())


def in_sync_replicas(bootstrap: str, topic: str) -> dict[int, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {partition: len(info.isrs) for partition, info in metadata.topics[topic].partitions.items()}


def test_a_broker_killed_while_a_worker_commits_loses_nothing_and_rejoins(cluster, tmp_path: Path, unique_name):
    bootstrap, nodes = cluster
    orders = make_orders(6_000, 50)
    source = unique_name("orders")
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    kafka.create_topic(source, PARTITIONS, -1, {})  # the cluster's default: three replicas
    produce(bootstrap, source, orders)
    app = totals_app(
        bootstrap, source, tmp_path, unique_name("totals"), step=slow_total, processing_guarantee="exactly-once"
    )
    worker = app.worker(max_seconds=MAX_SECONDS)
    outcome: dict[str, object] = {}
    thread = threading.Thread(target=run_into, args=(worker, outcome), daemon=True)
    thread.start()

    def committed() -> int:
        return sum(o or 0 for o in kafka.committed_offsets(app.consumer_group, source, range(PARTITIONS)).values())

    wait_for(lambda: 0 < committed() < 3_000, 120, "the worker's first commits")
    for internal in ("__consumer_offsets", "__transaction_state"):  # a dead broker leaves them two in-sync replicas
        layout = kafka.topic_layout(internal)
        assert layout is not None and layout.replication_factor == 3, (internal, layout)
        assert kafka.topic_config(internal)["min.insync.replicas"] == "2", internal
    nodes.kill(2)
    thread.join(MAX_SECONDS + SHUTDOWN_GRACE_SECONDS + 5)

    assert not thread.is_alive(), "the worker ended within max_seconds and its grace"
    report = outcome.get("report")
    assert isinstance(report, WorkerReport), f"the worker failed: {outcome.get('error')!r}"
    assert report.stop_reason == "caught_up" and report.total_processed >= 6_000
    assert committed() == 6_000
    changelog = app.changelog_topic("totals")
    latest = {
        split_store_key(message.key())[0].decode(): orjson.loads(message.value())
        for message in read_committed(bootstrap, changelog)
    }
    stored, expected = totals_in_store(app, PARTITIONS), expected_totals(orders)
    assert stored == latest, "the store holds what its changelog holds"
    assert stored == expected, "exactly-once is exact"

    nodes.start_node(2)
    wait_for(
        lambda: set(in_sync_replicas(bootstrap, changelog).values()) == {3},
        120,
        "the restarted broker back in every changelog partition's in-sync replicas",
        interval=1.0,
    )


def test_watermarks_wait_out_a_dead_leader_instead_of_answering_an_invalid_offset(cluster, unique_name):
    """librdkafka answers ListOffsets for a partition whose leader's broker died with offset -1001
    and no error; read as a changelog's end, that once failed a restore as "changelog recreated"."""
    bootstrap, nodes = cluster
    topic = unique_name("ends")
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    kafka.create_topic(topic, 6, -1, {})
    produce(bootstrap, topic, make_orders(600, 50))
    ends = kafka.watermarks(topic, range(6))
    assert sum(high for _, high in ends.values()) == 600
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    leaders = {info.leader for info in metadata.topics[topic].partitions.values()}
    node = min(leaders)

    nodes.kill(node)
    try:
        # Asked again and again while the dead broker still leads partitions (until it is fenced,
        # about 10 s, and new leaders are elected), and a few seconds past the election.
        deadline = time.monotonic() + ELECTION_SECONDS
        elected = None
        while elected is None or time.monotonic() < elected + AFTER_ELECTION_SECONDS:
            assert kafka.watermarks(topic, range(6)) == ends
            assert kafka.watermarks(topic, range(6), committed=True) == ends
            if elected is None and led_by_live_brokers(bootstrap, topic, node):
                elected = time.monotonic()
            assert elected is not None or time.monotonic() < deadline, f"no new leaders within {ELECTION_SECONDS} s"
    finally:
        nodes.start_node(node)
    wait_for(
        lambda: set(in_sync_replicas(bootstrap, topic).values()) == {3},
        120,
        "the restarted broker back in every partition's in-sync replicas",
        interval=1.0,
    )
