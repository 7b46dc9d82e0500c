"""The development brokers' configuration: `server.properties` and the log4j2 set-up.

Owns the settings that make a KRaft node (broker and controller in one process) suit development
and tests: no initial rebalance delay, short session timeouts allowed, a log cleaner that compacts
within seconds, transactions aborted within a second once they time out (Kafka checks every 10 s),
and no automatic topic creation; one node alone keeps one replica of everything, the nodes of a
cluster (`cluster_properties`) three, with writes acknowledged by two (`min.insync.replicas=2`), as
production clusters run.
"""

from __future__ import annotations

from pathlib import Path

from dagster_stateful.local_processes import HOST


def server_properties(
    data_dir: Path, port: int, controller_port: int, node_id: int = 1, quorum_voters: str | None = None
) -> dict[str, str]:
    """One node's settings; `quorum_voters` ("id@host:port,...") when it is one of a cluster's."""
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": quorum_voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.partitions": "1",
        "default.replication.factor": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "log.cleaner.backoff.ms": "200",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "log.cleaner.dedupe.buffer.size": "33554432",
        "log.retention.check.interval.ms": "1000",
        "log.segment.delete.delay.ms": "1000",
    }


CLUSTER_REPLICATION = 3
CLUSTER_MIN_INSYNC = 2


def cluster_properties(nodes: int) -> dict[str, str]:
    """What the nodes of a cluster of `nodes` (three or more) set over `server_properties`."""
    replication, insync = str(min(nodes, CLUSTER_REPLICATION)), str(min(nodes - 1, CLUSTER_MIN_INSYNC))
    return {
        "default.replication.factor": replication,
        "min.insync.replicas": insync,
        "offsets.topic.replication.factor": replication,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": insync,
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": insync,
        "unclean.leader.election.enable": "false",
        # A dead replica leaves the in-sync set after 10 s rather than 30: acks=all writes wait that long.
        "replica.lag.time.max.ms": "10000",
    }


LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = warn
"""
