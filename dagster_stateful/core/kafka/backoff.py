"""The pauses and attempt timeouts of one retried admin call.

Owns `Backoff`: how long a retried call may go on (the admin timeout, or less before a deadline),
the capped exponential pauses between its tries, and each try's timeout. The first try is short
(`FIRST_ATTEMPT_TIMEOUT`) and each next one may take twice as long, up to `ATTEMPT_TIMEOUT`: a
healthy cluster answers in milliseconds, and a refused login or TLS handshake, which librdkafka's
calls only see as a timeout, is then raised within seconds (see `security_failures`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ATTEMPT_TIMEOUT = 10.0
"""The longest try of an admin call that may be retried within the admin timeout."""
FIRST_ATTEMPT_TIMEOUT = 2.0
"""The first try of an admin call (see the module)."""
MIN_ATTEMPT_TIMEOUT = 1.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
WARN_AFTER = 5.0
"""Failures lasting this long are logged as a warning (once per call), shorter ones at debug level."""


@dataclass
class Backoff:
    """The deadline and the capped exponential pauses of one retried admin call."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    pause: float = BACKOFF_FIRST
    attempt_cap: float = FIRST_ATTEMPT_TIMEOUT
    warned: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def attempt_timeout(self) -> float:
        return min(self.attempt_cap, max(MIN_ATTEMPT_TIMEOUT, self.remaining()))

    def sleep(self) -> None:
        time.sleep(max(0.0, min(self.pause, self.remaining())))
        self.pause = min(self.pause * 2, BACKOFF_MAX)
        self.attempt_cap = min(self.attempt_cap * 2, ATTEMPT_TIMEOUT)
