"""Timers: what `StreamingDataFrame.on_timer` declares.

Owns `OnTimer`: the store whose timers the app handles and the function called when one fires,
`function(timer, state)`, with the `Timer` (its message key, name, due time and clock) and the
key's `State` in that store (the same view the app's stateful steps get, so the function may read,
change, and schedule again). What it returns, unless None, is sent to the app's output topic under
the timer's message key. What it raises goes to the error policy, as a step's failure does, with
the timer's key and the offset of the message it fired after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.processing.dsl.steps import StepFailed
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.timers import Timer
from dagster_stateful.errors import StateStoreError

__all__ = ["OnTimer", "Timer"]


@dataclass(frozen=True)
class OnTimer:
    store: str
    function: Callable[[Timer, State], Any]

    @property
    def name(self) -> str:
        return str(getattr(self.function, "__name__", repr(self.function)))

    def call(self, timer: Timer, state: State) -> Any:
        """The function's result; `StepFailed` for what it raised (a damaged store's error passes as it is)."""
        try:
            return self.function(timer, state)
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(f"on_timer {self.name}", error) from error
