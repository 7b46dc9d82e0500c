"""What happens to a message that cannot be processed: the app's error policy.

Owns `BadInputHandler`: under "raise" the worker stops with a `ProcessingError` naming topic,
partition and offset (nothing past that offset is committed); under "skip" the message is counted
and logged; under "dead-letter" its raw key, value and headers go to `<app>-dead-letter` with
headers describing the failure, and processing goes on (a full producer queue is waited out,
serving delivery reports, as for outputs), produced through the commit path (`produce`), so under
exactly-once they belong to the transaction of the commit that passes the message. A message
late for all of its windows is not an error: it is counted and logged (now and then, not each
one), and dead-lettered under "dead-letter".
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from confluent_kafka import Message

from dagster_stateful.core.config import ErrorPolicy
from dagster_stateful.core.kafka.records import Headers, position
from dagster_stateful.errors import LateMessage, ProcessingError

log = logging.getLogger(__name__)

ERROR_HEADER_PREFIX = "x-dagster-stateful-"
LATE_LOGGED_EVERY = 1000
"""After the first, one late message in this many is logged."""


class BadInputHandler:
    def __init__(
        self,
        policy: ErrorPolicy,
        produce: Callable[[str, bytes | None, bytes | None, Headers], None],
        dead_letter_topic: str,
    ) -> None:
        """produce: (topic, key, value, headers) -> None, the commit path's `Committer.produce`."""
        self.policy = policy
        self._produce = produce
        self._topic = dead_letter_topic
        self.skipped = 0
        self.dead_lettered = 0
        self.late = 0

    @property
    def counts(self) -> tuple[int, int, int]:
        """(skipped, dead-lettered, late) messages so far."""
        return self.skipped, self.dead_lettered, self.late

    def handle(self, message: Message, stage: str, error: BaseException) -> None:
        """Apply the policy to `message`, which failed in `stage`. Raises under the `raise` policy."""
        topic, partition, offset = position(message)
        where = f"{topic}[{partition}] offset {offset}"
        if self.policy is ErrorPolicy.RAISE:
            raise ProcessingError(
                f"cannot process the message at {where} ({stage}): {type(error).__name__}: {error}. Nothing from "
                "this offset on was committed. Fix the data or the step and rerun, or set on_error='skip' or "
                "'dead-letter' to let such messages through.",
                topic,
                partition,
                offset,
            ) from error
        if self.policy is ErrorPolicy.SKIP:
            self.skipped += 1
            log.warning("Skipped the message at %s (%s): %s: %s", where, stage, type(error).__name__, error)
            return
        self._dead_letter(message, stage, error)
        self.dead_lettered += 1
        log.warning("Sent the message at %s to %s (%s): %s: %s", where, self._topic, stage, type(error).__name__, error)

    def handle_late(self, message: Message, stream_time: int) -> None:
        """`message` came after all of its windows closed: count it, log it now and then, and
        dead-letter it under the dead-letter policy."""
        self.late += 1
        topic, partition, offset = position(message)
        why = (
            f"the message at {topic}[{partition}] offset {offset} is late: every window it belongs to closed "
            f"(the partition's stream time is {stream_time} ms); raise the windows' grace to count such messages"
        )
        if self.policy is ErrorPolicy.DEAD_LETTER:
            self._dead_letter(message, "late for its windows", LateMessage(why))
            self.dead_lettered += 1
        if self.late == 1 or self.late % LATE_LOGGED_EVERY == 0:
            log.warning("%s (%d late messages so far)", why, self.late)

    def _dead_letter(self, message: Message, stage: str, error: BaseException) -> None:
        topic, partition, offset = position(message)
        headers: Headers = [*(message.headers() or [])]
        headers += [
            (f"{ERROR_HEADER_PREFIX}stage", stage.encode()),
            (f"{ERROR_HEADER_PREFIX}error-type", type(error).__name__.encode()),
            (f"{ERROR_HEADER_PREFIX}error-message", str(error)[:4000].encode()),
            (f"{ERROR_HEADER_PREFIX}traceback", "".join(traceback.format_exception(error))[-8000:].encode()),
            (f"{ERROR_HEADER_PREFIX}source-topic", topic.encode()),
            (f"{ERROR_HEADER_PREFIX}source-partition", str(partition).encode()),
            (f"{ERROR_HEADER_PREFIX}source-offset", str(offset).encode()),
        ]
        self._produce(self._topic, message.key(), message.value(), headers)
