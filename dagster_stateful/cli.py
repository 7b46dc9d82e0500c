"""The `dagster-stateful` command line.

Owns argument parsing and what the commands print. `dagster-stateful kafka start | stop | status`
runs a local development broker, or with `start --brokers 3` a cluster of three: `start` prints
only the bootstrap address on stdout, so `export KAFKA_BOOTSTRAP_SERVERS=$(dagster-stateful kafka
start)` works; progress and errors go to stderr. Exit codes: 0 success (for `status`: running,
every node of a cluster), 1 error (for `status`: alive but not answering, or a cluster with a node
down), 3 not running. `kafka start --secured` starts a broker serving SASL_SSL (SCRAM-SHA-512) and
mutual TLS only, with ACLs denying by default. `dagster-stateful spark start --workers N | stop |
status` runs a local Spark standalone cluster the same way (`start` prints the master URL).
`dagster-stateful acls MODULE:APP --principal User:NAME` prints the `kafka-acls` commands that grant
an app exactly the ACLs it needs (`--table`: as a Markdown table).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dagster_stateful.errors import StatefulError

if TYPE_CHECKING:
    from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker

DEFAULT_KAFKA_HOME = Path(".dagster-stateful") / "kafka"
KAFKA_HOME_ENV = "DAGSTER_STATEFUL_KAFKA_HOME"
DEFAULT_SPARK_HOME = Path(".dagster-stateful") / "spark"
EXIT_NOT_RUNNING = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    arguments = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return arguments.handler(arguments)
    except StatefulError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dagster-stateful", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    kafka = commands.add_parser("kafka", help="run a local Kafka broker (or a cluster of them) for development")
    actions = kafka.add_subparsers(required=True, metavar="ACTION")

    home_help = f"broker home: config, data, logs (default ${KAFKA_HOME_ENV} or ./{DEFAULT_KAFKA_HOME})"
    start = actions.add_parser("start", help="start the broker (or find it running); print its bootstrap address")
    start.add_argument("--home", type=Path, help=home_help)
    start.add_argument("--port", type=int, help="client (PLAINTEXT) port; default: a free port")
    start.add_argument("--controller-port", type=int, help="KRaft controller port; default: a free port")
    start.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra server.properties entry (repeatable)"
    )
    start.add_argument(
        "--brokers", type=int, default=1, help="1: one broker; 3 or more: a KRaft cluster with replication factor 3"
    )
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the broker to answer")
    start.add_argument(
        "--secured",
        action="store_true",
        help="serve SASL_SSL (SCRAM-SHA-512) and mutual TLS only, with ACLs denying by default (one broker)",
    )
    start.set_defaults(handler=_start)

    stop = actions.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL after --timeout)")
    stop.add_argument("--home", type=Path, help=home_help)
    stop.add_argument("--timeout", type=float, default=30.0)
    stop.set_defaults(handler=_stop)

    status = actions.add_parser("status", help="say whether the broker runs and answers")
    status.add_argument("--home", type=Path, help=home_help)
    status.set_defaults(handler=_status)
    _spark_commands(commands)
    _acls_command(commands)
    return parser


def _acls_command(commands: argparse._SubParsersAction) -> None:
    acls = commands.add_parser("acls", help="print the Kafka ACLs an app needs, as kafka-acls commands")
    acls.add_argument("app", metavar="MODULE:ATTRIBUTE", help="the App, e.g. my_project.apps:order_totals")
    acls.add_argument("--principal", default="User:APP_USER", help="who gets them (default: %(default)s)")
    acls.add_argument("--bootstrap-server", default="BROKER:9093", help="for the printed commands")
    acls.add_argument(
        "--command-config", default="admin.properties", help="the admin's client properties file, for the commands"
    )
    acls.add_argument("--table", action="store_true", help="print a Markdown table (resource, operation, why)")
    acls.set_defaults(handler=_acls)


def _acls(arguments: argparse.Namespace) -> int:
    from dagster_stateful.component_models import load_app
    from dagster_stateful.core.kafka.security.acls import kafka_acls_commands, markdown_table, required_acls

    sys.path.insert(0, os.getcwd())  # a module of the current project, as `python -m` would find it
    app = load_app(arguments.app)
    required = required_acls(app.config, app.topic_specs())
    if arguments.table:
        print(markdown_table(required))
        return 0
    commands = kafka_acls_commands(required, arguments.principal, arguments.bootstrap_server, arguments.command_config)
    print("\n".join(commands))
    return 0


def _spark_commands(commands: argparse._SubParsersAction) -> None:
    spark = commands.add_parser("spark", help="run a local Spark standalone cluster (master and workers)")
    actions = spark.add_subparsers(required=True, metavar="ACTION")
    home_help = f"cluster home: logs, work directories, state (default ./{DEFAULT_SPARK_HOME})"
    start = actions.add_parser("start", help="start the master and workers; print the master URL")
    start.add_argument("--home", type=Path, default=DEFAULT_SPARK_HOME, help=home_help)
    start.add_argument("--workers", type=int, default=2)
    start.add_argument("--cores", type=int, default=1, help="cores per worker")
    start.add_argument("--memory", default="1g", help="memory per worker")
    start.add_argument("--timeout", type=float, default=120.0)
    start.set_defaults(handler=_spark_start)
    stop = actions.add_parser("stop", help="stop every process of the cluster")
    stop.add_argument("--home", type=Path, default=DEFAULT_SPARK_HOME, help=home_help)
    stop.set_defaults(handler=_spark_stop)
    status = actions.add_parser("status", help="say whether the cluster runs and how many workers are alive")
    status.add_argument("--home", type=Path, default=DEFAULT_SPARK_HOME, help=home_help)
    status.set_defaults(handler=_spark_status)


def _spark_start(arguments: argparse.Namespace) -> int:
    from dagster_stateful.spark.cluster import LocalSparkCluster

    cluster = LocalSparkCluster(arguments.home, arguments.workers, arguments.cores, arguments.memory)
    print(f"starting a Spark cluster of {arguments.workers} workers in {cluster.home} ...", file=sys.stderr)
    master_url = cluster.start(timeout=arguments.timeout)
    print(f"Spark cluster running: {cluster.status().describe()} (logs: {cluster.home / 'logs'})", file=sys.stderr)
    print(master_url)
    return 0


def _spark_stop(arguments: argparse.Namespace) -> int:
    from dagster_stateful.spark.cluster import LocalSparkCluster

    cluster = LocalSparkCluster(arguments.home)
    stopped = cluster.stop()
    print(f"stopped the Spark cluster in {cluster.home}" if stopped else f"no Spark cluster ran in {cluster.home}")
    return 0


def _spark_status(arguments: argparse.Namespace) -> int:
    from dagster_stateful.spark.cluster import LocalSparkCluster

    status = LocalSparkCluster(arguments.home).status()
    print(status.describe())
    if not status.running:
        return EXIT_NOT_RUNNING
    return 0 if status.alive_workers == status.expected_workers else 1


def _home(arguments: argparse.Namespace) -> Path:
    return arguments.home or Path(os.environ.get(KAFKA_HOME_ENV) or DEFAULT_KAFKA_HOME)


def _start(arguments: argparse.Namespace) -> int:
    from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker

    properties = dict(_key_value(entry) for entry in arguments.set)
    if arguments.brokers != 1:
        if arguments.secured:
            raise SystemExit("error: --secured starts one broker; leave out --brokers")
        return _start_cluster(arguments, BrokerSettings(properties=properties))
    settings = BrokerSettings(
        port=arguments.port, controller_port=arguments.controller_port, properties=properties, secured=arguments.secured
    )
    broker = LocalKafkaBroker(_home(arguments), settings)
    print(f"starting Kafka broker in {broker.home} ...", file=sys.stderr)
    bootstrap = broker.start(timeout=arguments.timeout)
    print(f"Kafka broker running at {bootstrap} (logs: {broker.log_file})", file=sys.stderr)
    if arguments.secured:
        _describe_secured(broker)
    print(bootstrap)
    return 0


def _describe_secured(broker: LocalKafkaBroker) -> None:
    from dagster_stateful.local_kafka.secured import DEVELOPER, SCRAM_MECHANISM

    endpoints = broker.endpoints()
    print(
        f"  SASL_SSL ({SCRAM_MECHANISM}) at {endpoints.sasl_ssl}; mutual TLS at {endpoints.mutual_tls}\n"
        f"  CA certificate (ssl.ca.location): {endpoints.ca_certificate}\n"
        f"  user {DEVELOPER!r} (a super user), password in {endpoints.developer_password_file}\n"
        "  other users have only what ACLs grant them (allow.everyone.if.no.acl.found=false)",
        file=sys.stderr,
    )


def _start_cluster(arguments: argparse.Namespace, settings: BrokerSettings) -> int:
    from dagster_stateful.local_kafka.cluster import LocalKafkaCluster

    if arguments.port or arguments.controller_port:
        raise SystemExit("error: --port and --controller-port choose one broker's ports; a cluster picks its own")
    cluster = LocalKafkaCluster(_home(arguments), arguments.brokers, settings)
    print(f"starting a Kafka cluster of {arguments.brokers} brokers in {cluster.home} ...", file=sys.stderr)
    bootstrap = cluster.start(timeout=arguments.timeout)
    print(f"Kafka cluster running at {bootstrap}\n{cluster.describe()}", file=sys.stderr)
    print(bootstrap)
    return 0


def _stop(arguments: argparse.Namespace) -> int:
    from dagster_stateful.local_kafka.broker import LocalKafkaBroker
    from dagster_stateful.local_kafka.cluster import LocalKafkaCluster

    if LocalKafkaCluster.exists(_home(arguments)):
        cluster = LocalKafkaCluster.at(_home(arguments))
        stopped = cluster.stop(timeout=arguments.timeout)
        print(
            f"stopped the Kafka cluster in {cluster.home}"
            if stopped
            else f"no Kafka broker was running in {cluster.home}"
        )
        return 0
    broker = LocalKafkaBroker(_home(arguments))
    stopped = broker.stop(timeout=arguments.timeout)
    print(f"stopped the Kafka broker in {broker.home}" if stopped else f"no Kafka broker was running in {broker.home}")
    return 0


def _status(arguments: argparse.Namespace) -> int:
    from dagster_stateful.local_kafka.broker import BrokerState, LocalKafkaBroker
    from dagster_stateful.local_kafka.cluster import LocalKafkaCluster

    if LocalKafkaCluster.exists(_home(arguments)):
        cluster = LocalKafkaCluster.at(_home(arguments))
        states = [status.state for status in cluster.statuses()]
        print(cluster.describe())
        if all(state is BrokerState.RUNNING for state in states):
            return 0
        return EXIT_NOT_RUNNING if all(state is not BrokerState.RUNNING for state in states) else 1
    status = LocalKafkaBroker(_home(arguments)).status()
    print(status.describe())
    if status.state is BrokerState.RUNNING:
        return 0
    return 1 if status.state is BrokerState.UNRESPONSIVE else EXIT_NOT_RUNNING


def _key_value(entry: str) -> tuple[str, str]:
    key, separator, value = entry.partition("=")
    if not separator or not key:
        raise SystemExit(f"error: --set expects KEY=VALUE, got {entry!r}")
    return key.strip(), value.strip()


if __name__ == "__main__":
    sys.exit(main())
