"""What the parallel restores' child processes share: work split into balanced groups, children
that die with their parent, and the end of a failed child's error output for the parent's error.

Kept apart from the restores themselves so that a child imports only what it runs. A child ties
its life to its parent's itself, first thing (`child_command`), so that the parent starts it
without a `preexec_fn`: Python then spawns it with vfork instead of forking a copy of the worker,
whose librdkafka threads make a fork unsafe (Python's documentation: a child forked with
`preexec_fn` in a threaded process may deadlock before it runs).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

STDERR_SHOWN = 2_000
"""Characters of a failed child's error output quoted in the parent's error."""


def balanced_groups(items: list[T], weight: Callable[[T], int], processes: int) -> list[list[T]]:
    """At most `processes` non-empty groups; each item joins the group with the least weight so far,
    the heaviest items first."""
    groups: list[list[T]] = [[] for _ in range(max(1, min(processes, len(items))))]
    loads = [0] * len(groups)
    for item in sorted(items, key=weight, reverse=True):
        lightest = loads.index(min(loads))
        groups[lightest].append(item)
        loads[lightest] += weight(item)
    return [group for group in groups if group] or [[]]


def last_words(stderr: bytes) -> str:
    return stderr.decode(errors="replace")[-STDERR_SHOWN:].strip().rstrip(".") or "no error output"


def child_command(module: str) -> list[str]:
    """The command of a child process running `module`'s `main()`, which dies with this process."""
    tie = f"from {__name__} import die_with; die_with({os.getpid()})"
    return [sys.executable, "-c", f"{tie}; from {module} import main; main()"]


def die_with(parent: int) -> None:
    """In a child: get SIGKILL when the thread that started it ends (Linux), and end at once if
    `parent` (its pid) has ended already."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


def die_with_parent() -> None:
    """Linux's PR_SET_PDEATHSIG: the child gets SIGKILL when the thread that started it ends."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
