"""A real single-node Apache Kafka broker (KRaft, combined broker + controller) on 127.0.0.1.

Owns the life of a development broker: its jars (from Maven Central through `maven`), its home
directory (configuration, data, logs and a `broker.json` state file naming the running process),
formatting storage, starting on free or chosen ports, waiting until it answers, reporting its
status and stopping it cleanly (SIGTERM, wait, then SIGKILL). The settings suit one node and
tests: replication factors of 1, no initial rebalance delay, a log cleaner that acts within
seconds, and no automatic topic creation (topics are provisioned explicitly, as in production).
A secured broker (`BrokerSettings(secured=True)`, see `secured`) serves clients over SASL_SSL and
mutual TLS only, with ACLs denying by default.
"""

from __future__ import annotations

import base64
import logging
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from dagster_stateful.errors import BrokerStartError, LocalKafkaError, PortInUseError
from dagster_stateful.local_kafka.config import HOST, LOG4J2_PROPERTIES, server_properties
from dagster_stateful.local_kafka.secured import (
    DEVELOPER,
    SecuredEndpoints,
    SecuredPorts,
    developer_password,
    secured_properties,
)
from dagster_stateful.local_kafka.tls import TlsMaterial
from dagster_stateful.local_processes import (
    check_port_free,
    find_java,
    free_port,
    launch,
    port_open,
    read_state_file,
    send_signal,
    write_state_file,
)
from dagster_stateful.maven import JarBundle, bundle_jars

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.3.1"
LOG4J_VERSION = "2.25.4"  # log4j-core's version in kafka 4.3.1's POM; the SLF4J binding must match it
STATE_FILE = "broker.json"


def broker_bundle(kafka_version: str = KAFKA_VERSION) -> JarBundle:
    """The broker's jars: kafka_2.13 with its runtime closure plus the SLF4J binding its POM leaves out."""
    return JarBundle(
        name=f"kafka-broker-{kafka_version}",
        artifacts=(
            f"org.apache.kafka:kafka_2.13:{kafka_version}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ),
    )


class BrokerState(StrEnum):
    RUNNING = "running"
    UNRESPONSIVE = "unresponsive"
    """The process lives but does not answer a metadata request."""
    STALE = "stale"
    """A state file names a process that is gone (killed, or the machine restarted)."""
    NOT_RUNNING = "not running"


@dataclass(frozen=True)
class BrokerStatus:
    state: BrokerState
    home: Path
    pid: int | None = None
    bootstrap_servers: str | None = None

    def describe(self) -> str:
        if self.state is BrokerState.RUNNING:
            return f"running: {self.bootstrap_servers} (pid {self.pid}, home {self.home})"
        if self.state is BrokerState.UNRESPONSIVE:
            return (
                f"unresponsive: pid {self.pid} is alive but {self.bootstrap_servers} does not answer; "
                f"see {self.home / 'logs' / 'server.log'}"
            )
        if self.state is BrokerState.STALE:
            return f"not running (the broker with pid {self.pid} is gone; its state file in {self.home} is stale)"
        return f"not running (no broker started from {self.home})"


@dataclass(frozen=True)
class BrokerSettings:
    """How to run the broker. Ports left as None are picked free at start."""

    port: int | None = None
    controller_port: int | None = None
    heap: str = "512m"
    kafka_version: str = KAFKA_VERSION
    properties: Mapping[str, str] = field(default_factory=dict)
    """Extra or overriding `server.properties` entries."""
    node_id: int = 1
    quorum_voters: str | None = None
    """The controller quorum ("id@host:port,...") of a cluster this node belongs to; None: alone."""
    cluster_id: str | None = None
    """The KRaft cluster id to format storage with (every node of a cluster shares one); None: a new one."""
    secured: bool = False
    """Serve clients over SASL_SSL (SCRAM-SHA-512) and mutual TLS only, with ACLs denying by default."""


def new_cluster_id() -> str:
    """A random KRaft cluster id (a base64url UUID) that does not start with "-", which the storage
    tool's command line would read as an option (Kafka's own Uuid.randomUuid avoids it the same way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafkaBroker:
    """One broker living in `home`. Usable as a context manager (start on enter, stop on exit)."""

    def __init__(self, home: Path | str, settings: BrokerSettings | None = None) -> None:
        self.home = Path(home).resolve()
        self.settings = settings or BrokerSettings()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    @property
    def bootstrap_servers(self) -> str:
        state = self._read_state()
        if state is None:
            raise LocalKafkaError(f"no broker has been started from {self.home}")
        return state["bootstrap_servers"]

    def __enter__(self) -> LocalKafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0, tie_to_parent: bool = False) -> str:
        """Start the broker (or find it already running) and return its bootstrap address.

        With `tie_to_parent`, the broker gets SIGTERM when the calling process dies, so a test
        session killed outright leaves no broker behind.
        """
        current = self.status()
        if current.state is BrokerState.RUNNING:
            log.info("Kafka broker already %s", current.describe())
            return current.bootstrap_servers or ""
        bootstrap = self.launch(tie_to_parent)
        self.wait_until_ready(timeout)
        return bootstrap

    def launch(self, tie_to_parent: bool = False) -> str:
        """Start the broker's process without waiting for it to answer (the nodes of a cluster must
        all be launched before any can answer); returns its bootstrap address."""
        if self.status().state is BrokerState.UNRESPONSIVE:
            raise BrokerStartError(f"a broker from {self.home} is {self.status().describe()}; stop it first")
        java = find_java()
        port, controller_port = self._claim_ports()
        secured = self._claim_secured_ports(port, controller_port) if self.settings.secured else None
        jars = bundle_jars(broker_bundle(self.settings.kafka_version))
        classpath = str(jars[0].parent / "*")
        self._write_config(port, controller_port, secured)
        self._format_storage(java, classpath)
        bootstrap = f"{HOST}:{port}"
        self._launch(java, classpath, tie_to_parent)
        assert self._process is not None
        state: dict[str, object] = {
            "pid": self._process.pid,
            "bootstrap_servers": bootstrap,
            "port": port,
            "controller_port": controller_port,
            "kafka_version": self.settings.kafka_version,
        }
        if secured is not None:
            state |= {
                "internal_bootstrap": f"{HOST}:{secured.internal}",
                "internal_port": secured.internal,
                "mutual_tls_bootstrap": f"{HOST}:{secured.mutual_tls}",
            }
        self._write_state(state)
        return bootstrap

    def endpoints(self) -> SecuredEndpoints:
        """Where the clients of this secured broker connect (raises unless it was started secured)."""
        state = self._read_state()
        if state is None or "internal_bootstrap" not in state:
            raise LocalKafkaError(f"no secured broker has been started from {self.home}")
        return SecuredEndpoints(
            state["bootstrap_servers"], state["mutual_tls_bootstrap"], state["internal_bootstrap"], self.home
        )

    def wait_until_ready(self, timeout: float = 120.0) -> None:
        """Wait for the launched broker to answer; stop it and raise `BrokerStartError` when it does not."""
        state = self._read_state()
        assert state is not None, "launch() first"
        try:
            self._wait_until_ready(_answering_address(state), state.get("internal_port", state["port"]), timeout)
            if "internal_bootstrap" in state:
                self.endpoints().admin().add_user(DEVELOPER, developer_password(self.home))
        except BaseException:
            self.stop()
            raise
        log.info(
            "Kafka %s broker ready at %s (home %s)", self.settings.kafka_version, state["bootstrap_servers"], self.home
        )

    def request_stop(self) -> None:
        """SIGTERM the broker without waiting (a cluster asks every node at once, since the last
        controller standing waits for a quorum that would be gone)."""
        state = self._read_state()
        pid = state["pid"] if state else None
        if pid is not None and self._is_broker_process(pid):
            send_signal(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for fault tests); `start()` brings it back on the same ports."""
        state = self._read_state()
        pid = state["pid"] if state else None
        if pid is not None and self._is_broker_process(pid):
            send_signal(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 30.0)
        if self._process is not None:
            self._process.wait(timeout=10)
            self._process = None

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker: SIGTERM, wait up to `timeout`, then SIGKILL. Returns whether one was running."""
        state = self._read_state()
        pid = state["pid"] if state else None
        was_running = pid is not None and self._is_broker_process(pid)
        if was_running:
            assert pid is not None
            log.info("Stopping Kafka broker pid %d", pid)
            send_signal(pid, signal.SIGTERM)
            if not self._wait_for_exit(pid, timeout):
                log.warning("Kafka broker pid %d ignored SIGTERM for %.0f s; killing it", pid, timeout)
                send_signal(pid, signal.SIGKILL)
                self._wait_for_exit(pid, 10.0)
        if self._process is not None:
            self._process.wait(timeout=10)
            self._process = None
        (self.home / STATE_FILE).unlink(missing_ok=True)
        return was_running

    def status(self) -> BrokerStatus:
        """What is true right now: running and answering, alive but silent, gone, or never started."""
        state = self._read_state()
        if state is None:
            return BrokerStatus(BrokerState.NOT_RUNNING, self.home)
        pid, bootstrap = state["pid"], state["bootstrap_servers"]
        if not self._is_broker_process(pid):
            return BrokerStatus(BrokerState.STALE, self.home, pid, bootstrap)
        answering = _answers_metadata(_answering_address(state), timeout=5.0)
        return BrokerStatus(BrokerState.RUNNING if answering else BrokerState.UNRESPONSIVE, self.home, pid, bootstrap)

    def _claim_ports(self) -> tuple[int, int]:
        port = check_port_free(self.settings.port, "PLAINTEXT (client)") if self.settings.port else free_port()
        controller = (
            check_port_free(self.settings.controller_port, "CONTROLLER")
            if self.settings.controller_port
            else free_port(avoid={port})
        )
        return port, controller

    def _claim_secured_ports(self, port: int, controller_port: int) -> SecuredPorts:
        mutual_tls = free_port(avoid={port, controller_port})
        return SecuredPorts(port, mutual_tls, free_port(avoid={port, controller_port, mutual_tls}), controller_port)

    def _write_config(self, port: int, controller_port: int, secured: SecuredPorts | None) -> None:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        settings = self.settings
        security = (
            {} if secured is None else secured_properties(self.home, secured, TlsMaterial(self.home / "tls").ensure())
        )
        properties = {
            **server_properties(self.home / "data", port, controller_port, settings.node_id, settings.quorum_voters),
            **security,
            **settings.properties,
        }
        (self.home / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2_PROPERTIES)

    def _format_storage(self, java: str, classpath: str) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = self.settings.cluster_id or new_cluster_id()
        command = [
            java,
            "-Xmx256m",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(self.home / "server.properties"),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting Kafka storage in {self.home / 'data'} failed "
                f"(exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
            )

    def _launch(self, java: str, classpath: str, tie_to_parent: bool) -> None:
        heap = self.settings.heap
        command = [
            java,
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(self.home / "server.properties"),
        ]
        self.log_file.unlink(missing_ok=True)
        self._process = launch(command, self.home / "logs" / "stdout.log", tie_to_parent)

    def _wait_until_ready(self, bootstrap: str, port: int, timeout: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._raise_start_failure(f"the broker process exited with code {self._process.returncode}", port)
            if port_open(port) and _answers_metadata(bootstrap, timeout=5.0):
                return
            time.sleep(0.2)
        self._raise_start_failure(f"the broker did not answer at {bootstrap} within {timeout:.0f} s", port)

    def _raise_start_failure(self, reason: str, port: int) -> None:
        tail = self._log_tail()
        if "Address already in use" in tail:
            raise PortInUseError(
                f"{reason}: a port it needs on {HOST} is already in use "
                f"(client port {port}). Free it or choose other ports.\n{tail}"
            )
        raise BrokerStartError(f"{reason}. Last lines of {self.log_file}:\n{tail}")

    def _log_tail(self, lines: int = 30) -> str:
        chunks = []
        for path in (self.log_file, self.home / "logs" / "stdout.log"):
            if path.exists():
                chunks.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(chunks) or "(the broker wrote no log)"

    def _is_broker_process(self, pid: int) -> bool:
        """True when `pid` is a live (not zombie) java process running this home's configuration."""
        if self._process is not None and self._process.pid == pid and self._process.poll() is not None:
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return "kafka.Kafka" in cmdline and str(self.home) in cmdline

    def _wait_for_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.pid == pid:
                try:
                    self._process.wait(timeout=0.2)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self._is_broker_process(pid):
                return True
            time.sleep(0.2)
        return False

    def _read_state(self) -> dict | None:
        return read_state_file(self.home / STATE_FILE)

    def _write_state(self, state: dict) -> None:
        write_state_file(self.home / STATE_FILE, state)


def _answering_address(state: dict) -> str:
    """Where to ask whether the broker answers: a secured broker's internal listener."""
    return str(state.get("internal_bootstrap", state["bootstrap_servers"]))


def _answers_metadata(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": int(timeout * 1000)})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not answering"
        return False
