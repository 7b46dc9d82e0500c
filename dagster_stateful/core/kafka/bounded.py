"""Blocking librdkafka calls bounded in time, also those that ignore the timeout they are given.

Owns `BoundedCalls`: the calls of one client that may block past any timeout. Measured with
librdkafka 2.16 against a broker stopped or frozen (SIGSTOP): `send_offsets_to_transaction(t)`
waits for its coordinator as long as the broker is away (60 s, `socket.timeout.ms`, when frozen),
whatever `t`; a synchronous consumer commit, which takes no timeout, waits as long as the
coordinator does not answer; a consumer's close waits for the commits in flight. Each such call
runs in a daemon thread that the caller waits for at most the seconds it has; past that the caller
gets `CallTimedOut` and the call is left to finish in the background. The client then refuses
other bounded calls, and its close is handed to the late call, to run once that returns: a handle
is never destroyed under a call in flight.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class CallTimedOut(Exception):
    """A blocking Kafka call did not return in the time it had (it may still complete later)."""

    def __init__(self, doing: str, reason: str) -> None:
        super().__init__(f"{doing}: {reason}")
        self.doing = doing
        self.reason = reason


@dataclass
class _Call:
    doing: str
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    then: list[Callable[[], object]] = field(default_factory=list)
    """What runs once the call returns, after it was left to finish in the background."""


class BoundedCalls:
    """The bounded calls of one client (`name` says which, in logs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._late: _Call | None = None

    @property
    def late(self) -> str | None:
        """What a call left to finish in the background is doing, while it has not returned."""
        late = self._late
        return None if late is None or late.done.is_set() else late.doing

    def call(self, doing: str, call: Callable[[], _T], seconds: float) -> _T:
        """`call()`'s result or error, if it returns within `seconds` (infinite: waits); else raises
        `CallTimedOut`, leaving the call to finish in the background."""
        blocked_by = self.late
        if blocked_by is not None:
            raise CallTimedOut(doing, f"the {self.name} is still busy {blocked_by}, which did not return in time")
        record = _Call(doing)
        threading.Thread(target=self._run, args=(record, call), name=f"{self.name}: {doing}", daemon=True).start()
        if not record.done.wait(None if math.isinf(seconds) else max(0.0, seconds)):
            with self._lock:
                if not record.done.is_set():
                    self._late = record
                    raise CallTimedOut(doing, f"no answer from Kafka within {seconds:.1f} s")
        if record.error is not None:
            raise record.error
        return cast(_T, record.result)

    def close(self, doing: str, close: Callable[[], object], seconds: float) -> None:
        """Close the client within `seconds`, or leave its close to finish in the background; with a
        call still in flight, the close runs once that call returns. Never raises."""
        with self._lock:
            late = self._late
            if late is not None and not late.done.is_set():
                late.then.append(close)
                log.warning(
                    "The %s is still busy %s, which did not return in time: %s happens once it has",
                    self.name,
                    late.doing,
                    doing,
                )
                return
        try:
            self.call(doing, close, seconds)
        except CallTimedOut as timed_out:
            log.warning("%s did not finish (%s); it goes on in the background", doing.capitalize(), timed_out.reason)
        except Exception:
            log.exception("%s failed", doing.capitalize())

    def _run(self, record: _Call, call: Callable[[], object]) -> None:
        try:
            record.result = call()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
            record.error = error
        finally:
            with self._lock:
                record.done.set()
                then, record.then = record.then, []
            if record is self._late:
                log.info("The late call of the %s (%s) returned: %r", self.name, record.doing, record.error)
            for action in then:
                try:
                    action()
                except Exception:
                    log.exception("Closing the %s after its late call failed", self.name)
