"""The example deployment (a dg project): `dg check defs` passes on it, its assets materialize against the broker, its
order counts drop resent orders and pass on each final minute once, and the README's run command
serves the UI and leaves nothing running after Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from dagster import AssetKey, DagsterInstance, load_from_defs_folder
from support.kafka_helpers import answers_http, free_port, read_messages, wait_for
from support.session_model import replay_sessions

from dagster_stateful import KafkaResource, StateStoreResource
from dagster_stateful.core import App
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, split_store_key
from dagster_stateful.local_kafka.secured import DEVELOPER, SCRAM_MECHANISM, developer_password

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(kafka_bootstrap, monkeypatch, tmp_path):
    """The example dg project on the test broker, with its state in a temporary directory: its
    apps module (`order_counts`, `ORDERS_PARTITIONS`, ...) and `defs`, loaded from its defs folder.

    The example's topic names are fixed (`orders`, ...): its tests share them, so they only
    assert what holds whatever ran before (the per-minute counts test runs first, since orders an
    earlier test wrote a moment before would make its own first minutes late).
    """
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("DAGSTER_STATEFUL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.syspath_prepend(str(ROOT))
    from example import apps

    return SimpleNamespace(
        defs=load_from_defs_folder(path_within_project=ROOT),
        order_counts=apps.order_counts,
        order_tiers=apps.order_tiers,
        ORDERS_PARTITIONS=apps.ORDERS_PARTITIONS,
        SESSION_GAP=apps.SESSION_GAP,
    )


def test_dg_checks_the_example_project(kafka_bootstrap):
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    result = subprocess.run(
        [sys.executable, "-m", "dagster_dg_cli.cli", "check", "defs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "All component YAML validated successfully" in result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_example_drops_resent_orders_and_counts_each_customers_minutes_once(example, kafka_bootstrap, tmp_path):
    defs = example.defs
    instance = DagsterInstance.ephemeral()
    orders_config = {"count": 400, "customers": 10, "spread_seconds": 180, "duplicates": 0.2}
    generated = defs.resolve_job_def("generate_orders").execute_in_process(
        instance=instance, run_config={"ops": {"write_orders": {"config": orders_config}}}
    )
    assert generated.success
    assert defs.resolve_job_def("order_counts__provision").execute_in_process(instance=instance).success

    worker = defs.resolve_job_def("order_counts__worker").execute_in_process(
        instance=instance, run_config={"ops": {"order_counts__run_worker_op": {"config": {"max_seconds": 120}}}}
    )

    assert worker.success
    sightings: dict[tuple[str, str], int] = {}
    ids_by_window: dict[tuple[str, int], set[str]] = {}
    for message in read_messages(kafka_bootstrap, "orders"):
        order = orjson.loads(message.value())
        sightings[(order["customer"], order["id"])] = sightings.get((order["customer"], order["id"]), 0) + 1
        start = message.timestamp()[1] // 60_000 * 60_000
        ids_by_window.setdefault((order["customer"], start), set()).add(order["id"])
    assert any(count > 1 for count in sightings.values()), "some orders were sent twice"
    app = StateStoreResource(state_dir=str(tmp_path / "state")).bind(
        example.order_counts, KafkaResource(bootstrap_servers=kafka_bootstrap)
    )
    assert _held_ids(app, example.ORDERS_PARTITIONS) == set(sightings), "every order id is held once, within its ttl"
    counts = [
        ((message.key().decode(), orjson.loads(message.value())["start"]), orjson.loads(message.value())["value"])
        for message in read_messages(kafka_bootstrap, "order-counts-per-minute")
    ]
    assert counts, "the orders span three minutes: some minutes are final"
    assert len(dict(counts)) == len(counts), "each customer's minute once"
    assert all(0 < count <= len(ids_by_window[window]) for window, count in counts), "copies are not counted"


def _held_ids(app: App, partitions: int) -> set[tuple[str, str]]:
    held = set()
    for partition in range(partitions):
        store = app.state.partition("seen", partition)
        store.open()
        try:
            for key, _ in store.items():
                if key != STREAM_TIME_KEY:
                    customer, order_id = split_store_key(key)
                    held.add((customer.decode(), order_id.decode()))
        finally:
            store.close()
    return held


def test_example_totals_orders_per_customer_tier_from_the_customers_table(example, kafka_bootstrap, tmp_path):
    defs = example.defs
    instance = DagsterInstance.ephemeral()
    generated = defs.resolve_job_def("generate_orders").execute_in_process(
        instance=instance, run_config={"ops": {"write_orders": {"config": {"count": 300, "customers": 30}}}}
    )
    assert generated.success
    assert defs.resolve_job_def("order_tiers__provision").execute_in_process(instance=instance).success

    worker = defs.resolve_job_def("order_tiers__worker").execute_in_process(
        instance=instance, run_config={"ops": {"order_tiers__run_worker_op": {"config": {"max_seconds": 120}}}}
    )

    assert worker.success
    tiers = {m.key().decode(): orjson.loads(m.value())["tier"] for m in read_messages(kafka_bootstrap, "customers")}
    expected: dict[str, float] = {}
    for message in read_messages(kafka_bootstrap, "orders"):
        order = orjson.loads(message.value())
        tier = tiers[order["customer"]]
        expected[tier] = expected.get(tier, 0.0) + order["amount"]
    app = StateStoreResource(state_dir=str(tmp_path / "state")).bind(
        example.order_tiers, KafkaResource(bootstrap_servers=kafka_bootstrap)
    )
    with app.read_state("per_tier") as reader:
        totals = {entry.message_key: entry.value for entry in reader.items()}
    assert totals == pytest.approx(expected)


def test_example_sends_each_customers_shopping_sessions_once_final(example, kafka_bootstrap, tmp_path):
    defs = example.defs
    instance = DagsterInstance.ephemeral()
    orders_config = {"count": 300, "customers": 10, "spread_seconds": 240, "duplicates": 0.0}
    generated = defs.resolve_job_def("generate_orders").execute_in_process(
        instance=instance, run_config={"ops": {"write_orders": {"config": orders_config}}}
    )
    assert generated.success
    assert defs.resolve_job_def("order_sessions__provision").execute_in_process(instance=instance).success

    worker = defs.resolve_job_def("order_sessions__worker").execute_in_process(
        instance=instance, run_config={"ops": {"order_sessions__run_worker_op": {"config": {"max_seconds": 120}}}}
    )

    assert worker.success
    gap, grace = int(example.SESSION_GAP.total_seconds() * 1000), 10_000
    by_partition: dict[int, list] = {}
    for message in read_messages(kafka_bootstrap, "orders"):
        order = orjson.loads(message.value())
        by_partition.setdefault(message.partition(), []).append((order["customer"], message.timestamp()[1], order))
    closed = {}
    for records in by_partition.values():
        replayed = replay_sessions(records, gap, grace)
        closed.update({sid: sum(o["amount"] for o in s.values) for sid, s in replayed.closed.items()})
    sent = [
        ((message.key().decode(), orjson.loads(message.value())["start"]), orjson.loads(message.value())["value"])
        for message in read_messages(kafka_bootstrap, "order-sessions")
    ]
    assert closed, "the orders span four minutes: some sessions are final"
    assert len(dict(sent)) == len(sent), "each session once"
    assert dict(sent) == pytest.approx(closed)


def test_example_generates_orders_and_keeps_totals(example):
    defs = example.defs
    instance = DagsterInstance.ephemeral()
    # 50 customers: their keys reach all 6 partitions (customer-000..019 leave partition 2 without a key, and a
    # worker run records no materialization for a partition it had nothing to do for).
    generated = defs.resolve_job_def("generate_orders").execute_in_process(
        instance=instance, run_config={"ops": {"write_orders": {"config": {"count": 300, "customers": 50}}}}
    )
    assert generated.success

    provisioned = defs.resolve_job_def("order_totals__provision").execute_in_process(instance=instance)
    assert provisioned.success
    worker = defs.resolve_job_def("order_totals__worker").execute_in_process(
        instance=instance, run_config={"ops": {"order_totals__run_worker_op": {"config": {"max_seconds": 120}}}}
    )

    assert worker.success
    materializations = [e.event_specific_data.materialization for e in worker.all_events if e.is_step_materialization]
    assert {m.partition for m in materializations} == {str(p) for p in range(example.ORDERS_PARTITIONS)}
    assert sum(m.metadata["keys"].value for m in materializations) >= 2 * 20, "a total and a count per customer"
    assert all(m.metadata["source_lag"].value == 0 for m in materializations)
    report = defs.resolve_assets_def(AssetKey(["order_totals", "top_customers"]))
    assert report.dependency_keys == {AssetKey(["order_totals", "totals_snapshot"])}, "the report reads the snapshot"


def test_the_example_runs_on_a_secured_cluster_configured_through_the_environment(secured_kafka, monkeypatch, tmp_path):
    password = developer_password(secured_kafka.home)
    for name, value in {
        "KAFKA_BOOTSTRAP_SERVERS": secured_kafka.sasl_ssl,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
        "KAFKA_SASL_USERNAME": DEVELOPER,
        "KAFKA_SASL_PASSWORD": password,
        "KAFKA_SSL_CA_LOCATION": str(secured_kafka.ca_certificate),
        "DAGSTER_STATEFUL_STATE_DIR": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(ROOT))
    defs = load_from_defs_folder(path_within_project=ROOT)
    instance = DagsterInstance.ephemeral()

    orders_config = {"count": 200, "customers": 50, "duplicates": 0.0}
    generated = defs.resolve_job_def("generate_orders").execute_in_process(
        instance=instance, run_config={"ops": {"write_orders": {"config": orders_config}}}
    )
    assert generated.success
    assert defs.resolve_job_def("order_totals__provision").execute_in_process(instance=instance).success
    worker = defs.resolve_job_def("order_totals__worker").execute_in_process(
        instance=instance, run_config={"ops": {"order_totals__run_worker_op": {"config": {"max_seconds": 120}}}}
    )

    assert worker.success
    materializations = worker.asset_materializations_for_node("order_totals__run_worker_op")
    assert sum(int(str(m.metadata["messages_processed"].value)) for m in materializations) == 200
    assert all(password not in repr(run.run_config) for run in instance.get_runs())


def _as_in_a_terminal() -> None:
    """Ctrl-C reaches a command started from a terminal, but not one started by a shell in the
    background (such a shell ignores SIGINT, and its children inherit that): undo it here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_run_command_serves_the_ui_and_stops_everything_on_ctrl_c(tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(DAGSTER_PORT=str(port), DAGSTER_STATEFUL_DEV_DIR=str(tmp_path / "dev"), DAGSTER_STATEFUL_VENV=sys.prefix)
    output = open(tmp_path / "run-example.log", "wb")  # noqa: SIM115 - the child writes to it until the end
    process = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "run-example")],
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )
    try:
        wait_for(
            lambda: answers_http(f"http://127.0.0.1:{port}/server_info"),
            180,
            f"the Dagster UI on port {port} (log: {tmp_path / 'run-example.log'})",
            interval=1.0,
        )
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "dagster_stateful.cli",
                "kafka",
                "status",
                "--home",
                str(tmp_path / "dev" / "kafka"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stdout

        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        output.close()
    log = (tmp_path / "run-example.log").read_text(errors="replace")
    assert f"Dagster UI: http://127.0.0.1:{port}" in log
    assert "superseded" not in log, "the UI runs with `dg dev`, not the superseded `dagster dev`"
    assert "stopped the Kafka broker" in log, log[-2000:]
    assert not _processes_mentioning(str(tmp_path / "dev")), "the broker outlived Ctrl-C"
    assert not _processes_mentioning(str(port)), "Dagster outlived Ctrl-C"
    assert not answers_http(f"http://127.0.0.1:{port}/server_info")


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
