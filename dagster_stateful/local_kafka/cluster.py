"""A real multi-node Apache Kafka cluster (KRaft) on 127.0.0.1, for what one broker cannot show.

Owns `LocalKafkaCluster`: N nodes (each broker and controller in one process, the controller
quorum made of all of them), each a `broker.LocalKafkaBroker` in `<home>/node-<id>` on ports
chosen once and kept in `<home>/cluster.json` (so a node killed and started again comes back where
its peers expect it), storage formatted with one cluster id, replication factor 3 and
`min.insync.replicas=2` (see `config.cluster_properties`). Every node is launched before any is
waited for, since a controller quorum answers only once a majority runs. `kill(node)` and
`start_node(node)` crash and revive one node, for fault tests.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from dagster_stateful.errors import LocalKafkaError
from dagster_stateful.local_kafka.broker import (
    BrokerSettings,
    BrokerState,
    BrokerStatus,
    LocalKafkaBroker,
    new_cluster_id,
)
from dagster_stateful.local_kafka.config import HOST, cluster_properties
from dagster_stateful.local_processes import free_ports

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"
MIN_NODES = 3


class LocalKafkaCluster:
    """`nodes` brokers living under `home`. Usable as a context manager (start on enter, stop on exit)."""

    def __init__(self, home: Path | str, nodes: int = MIN_NODES, settings: BrokerSettings | None = None) -> None:
        if nodes < MIN_NODES:
            raise LocalKafkaError(
                f"a cluster has at least {MIN_NODES} nodes (a replication factor of 3 needs them), got {nodes}; "
                "for one node, run a LocalKafkaBroker"
            )
        self.home = Path(home).resolve()
        self.nodes = nodes
        self._settings = settings or BrokerSettings()
        self._brokers: dict[int, LocalKafkaBroker] = {}

    @staticmethod
    def exists(home: Path | str) -> bool:
        """Whether `home` holds a cluster (rather than a single broker, or nothing)."""
        return (Path(home) / CLUSTER_FILE).exists()

    @classmethod
    def at(cls, home: Path | str) -> LocalKafkaCluster:
        """The cluster whose layout `home` holds, with as many nodes as it was made with."""
        layout = json.loads((Path(home) / CLUSTER_FILE).read_text())
        return cls(home, len(layout["nodes"]))

    def statuses(self) -> list[BrokerStatus]:
        """Each node's status, in node order."""
        return [self.broker(node).status() for node in range(1, self.nodes + 1)]

    def __enter__(self) -> LocalKafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        layout = self._layout()
        return ",".join(f"{HOST}:{node['port']}" for node in layout["nodes"].values())

    def broker(self, node: int) -> LocalKafkaBroker:
        """The broker of node `node` (1..nodes)."""
        if node not in self._brokers:
            layout = self._layout()
            entry = layout["nodes"].get(str(node))
            if entry is None:
                raise LocalKafkaError(f"the cluster in {self.home} has nodes {sorted(layout['nodes'])}, not {node}")
            voters = ",".join(f"{n}@{HOST}:{e['controller_port']}" for n, e in layout["nodes"].items())
            settings = replace(
                self._settings,
                port=entry["port"],
                controller_port=entry["controller_port"],
                node_id=node,
                quorum_voters=voters,
                cluster_id=layout["cluster_id"],
                properties={**cluster_properties(self.nodes), **self._settings.properties},
            )
            self._brokers[node] = LocalKafkaBroker(self.home / f"node-{node}", settings)
        return self._brokers[node]

    def start(self, timeout: float = 180.0, tie_to_parent: bool = False) -> str:
        """Start every node that does not run (all launched first, then waited for); returns the
        bootstrap address (every node's)."""
        self._layout()
        brokers = [self.broker(node) for node in range(1, self.nodes + 1)]
        launched = []
        for broker in brokers:
            if broker.status().state is not BrokerState.RUNNING:
                broker.launch(tie_to_parent)
                launched.append(broker)
        try:
            for broker in launched:
                broker.wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        bootstrap = self.bootstrap_servers
        log.info("Kafka cluster of %d nodes ready at %s (home %s)", self.nodes, bootstrap, self.home)
        return bootstrap

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node; returns whether any was running. The layout stays, so `start` brings the
        same cluster back."""
        if not self.exists(self.home):
            return False
        brokers = [self.broker(node) for node in range(1, self.nodes + 1)]
        for broker in brokers:
            broker.request_stop()
        stopped = [broker.stop(timeout) for broker in brokers]
        return any(stopped)

    def kill(self, node: int) -> None:
        """SIGKILL one node (its peers keep the cluster going)."""
        self.broker(node).kill()

    def start_node(self, node: int, timeout: float = 120.0) -> None:
        """Start one node again, on its ports, with its data."""
        self.broker(node).start(timeout)

    def describe(self) -> str:
        """One line per node: its state and address."""
        return "\n".join(f"node {node}: {self.broker(node).status().describe()}" for node in range(1, self.nodes + 1))

    def _layout(self) -> dict:
        """The nodes' ports and the cluster id, chosen on first use and kept in `cluster.json`."""
        path = self.home / CLUSTER_FILE
        if path.exists():
            layout = json.loads(path.read_text())
            if len(layout["nodes"]) != self.nodes:
                raise LocalKafkaError(
                    f"{self.home} holds a cluster of {len(layout['nodes'])} nodes, not {self.nodes}: stop it and "
                    "delete the directory to make another"
                )
            return layout
        self.home.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.nodes)
        layout = {
            "cluster_id": new_cluster_id(),
            "nodes": {
                str(node): {"port": ports[2 * (node - 1)], "controller_port": ports[2 * node - 1]}
                for node in range(1, self.nodes + 1)
            },
        }
        path.write_text(json.dumps(layout, indent=2))
        return layout
