"""The development broker's configuration: `server.properties` and the log4j2 set-up.

Owns the settings that make one KRaft node (broker and controller in one process) suit
development and tests: replication factors of 1, no initial rebalance delay, short session
timeouts allowed, a log cleaner that compacts within seconds, and no automatic topic creation.
"""

from __future__ import annotations

from pathlib import Path

HOST = "127.0.0.1"


def server_properties(data_dir: Path, port: int, controller_port: int) -> dict[str, str]:
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
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
        "log.cleaner.dedupe.buffer.size": "33554432",
        "log.retention.check.interval.ms": "1000",
        "log.segment.delete.delay.ms": "1000",
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
