"""`dagster-stateful kafka start | stop | status`: what a developer sees when running a local broker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from support.kafka_helpers import create_topic, free_port, read_all, wait_for

from dagster_stateful.errors import JavaNotFoundError, PortInUseError
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagster_stateful.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def broker_processes(home: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "kafka.Kafka" in cmdline and str(home) in cmdline:
            pids.append(int(proc.name))
    return pids


def test_cli_starts_reports_and_stops_a_broker(tmp_path):
    home = tmp_path / "kafka"
    try:
        started = cli("kafka", "start", "--home", str(home))
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        assert bootstrap.startswith("127.0.0.1:")
        assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).brokers

        status = cli("kafka", "status", "--home", str(home))
        assert status.returncode == 0
        assert f"running: {bootstrap}" in status.stdout

        again = cli("kafka", "start", "--home", str(home))
        assert again.returncode == 0 and again.stdout.strip() == bootstrap, "a second start reuses the broker"

        stopped = cli("kafka", "stop", "--home", str(home))
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert broker_processes(home) == []
        status = cli("kafka", "status", "--home", str(home))
        assert status.returncode == 3 and "not running" in status.stdout
    finally:
        cli("kafka", "stop", "--home", str(home))


def test_status_tells_when_the_broker_died(tmp_path):
    home = tmp_path / "kafka"
    try:
        assert cli("kafka", "start", "--home", str(home)).returncode == 0
        pid = json.loads((home / "broker.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not broker_processes(home), 30, "the killed broker to disappear")

        status = cli("kafka", "status", "--home", str(home))

        assert status.returncode == 3
        assert f"pid {pid} is gone" in status.stdout
    finally:
        cli("kafka", "stop", "--home", str(home))


def blocked_for_a_plain_bind(port: int) -> bool:
    """Whether binding `port` without SO_REUSEADDR fails, as it does while the last broker's
    connections on it are in TIME_WAIT."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_start_right_after_stop_reuses_the_same_port(tmp_path):
    home, port = tmp_path / "kafka", free_port()
    bootstrap = f"127.0.0.1:{port}"
    try:
        started = cli("kafka", "start", "--home", str(home), "--port", str(port))
        assert started.returncode == 0 and started.stdout.strip() == bootstrap, started.stderr
        create_topic(bootstrap, "greetings")
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        producer.produce("greetings", key=b"k", value=b"hello")
        assert producer.flush(30) == 0

        stopped = cli("kafka", "stop", "--home", str(home))  # the producer is still connected
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        assert blocked_for_a_plain_bind(port), "the broker's closed connections keep the port in TIME_WAIT"
        again = cli("kafka", "start", "--home", str(home), "--port", str(port))

        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == bootstrap
        assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).brokers
        assert read_all(bootstrap, "greetings") == [(b"k", b"hello")], "the same broker data, on the same port"
        del producer
    finally:
        cli("kafka", "stop", "--home", str(home))


def test_start_without_java_says_so(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = str(empty_bin)

    result = cli("kafka", "start", "--home", str(tmp_path / "kafka"), env=env)

    assert result.returncode == 1
    assert "Java was not found" in result.stderr
    assert "Java 17" in result.stderr
    assert broker_processes(tmp_path / "kafka") == []


def test_start_refuses_a_port_already_taken(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]

        result = cli("kafka", "start", "--home", str(tmp_path / "kafka"), "--port", str(port))

        assert result.returncode == 1
        assert f"port {port} on 127.0.0.1" in result.stderr and "already in use" in result.stderr
        with pytest.raises(PortInUseError, match="CONTROLLER"):
            LocalKafkaBroker(tmp_path / "api", BrokerSettings(controller_port=port)).start()
    assert broker_processes(tmp_path / "kafka") == []


def test_find_java_rejects_a_missing_java_home(tmp_path, monkeypatch):
    from dagster_stateful.local_processes import find_java

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="no-such-jdk"):
        find_java()
