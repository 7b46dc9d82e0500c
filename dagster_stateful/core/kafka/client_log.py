"""Where librdkafka's own log lines go: Python logging, not raw to stderr.

Owns `ClientLog` and `CLIENT_LOG`, the logger every client is given (`KafkaClients`).
"""

from __future__ import annotations

import logging


class ClientLog:
    """Where librdkafka's own log lines go (given to every client as its `logger`): the Python
    logger `dagster_stateful.core.kafka.librdkafka`, at most at WARNING, since what librdkafka
    reports as an error (a refused connection, a broker gone) is retried by the client, and the
    engine raises what it cannot get past with its own error."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, message: str, *args: object) -> None:
        self.logger.log(min(level, logging.WARNING), message, *args)


CLIENT_LOG = ClientLog(logging.getLogger(f"{__name__.rsplit('.', 1)[0]}.librdkafka"))
