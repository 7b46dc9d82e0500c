"""Opening a partition whose lock another process still holds waits for it, within a bound (real processes).

A worker that loses a partition in a rebalance may still be closing it when the new owner opens it
on the same state directory: the opener backs off and retries, and only a holder that keeps the
lock past the bound makes it fail, with an error naming the holder, the path and what to do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.errors import ConfigurationError, StateLockedError

REPO = Path(__file__).resolve().parents[3]
CONFIG = AppConfig(name="app", source="orders", stores=("totals",))

HOLD = """
import sys
import time
from pathlib import Path

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory

root, seconds = Path(sys.argv[1]), float(sys.argv[2])
part = StateDirectory(root, AppConfig(name="app", source="orders", stores=("totals",))).partition("totals", 0)
part.open()
part.commit([(b"k", b"held-and-released")], None, 7)
print("HOLDING", flush=True)
if seconds < 0:
    sys.stdin.read()  # hold until the test ends this process
time.sleep(seconds)
part.close()
print("RELEASED", flush=True)
sys.stdin.read()  # stay alive: the lock was released by close(), not by the process dying
"""


def holder(root: Path, seconds: float) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert process.stdout is not None, "started with stdout=PIPE"
        assert process.stdout.readline().strip() == "HOLDING"
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture
def brief_holder(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """Another process holding partition 0 for about 2 s, then closing it."""
    yield from holder(tmp_path, 2.0)


@pytest.fixture
def stuck_holder(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """Another process holding partition 0 until the test ends."""
    yield from holder(tmp_path, -1)


def test_an_opener_waits_for_a_holder_that_is_handing_the_partition_over(tmp_path, brief_holder):
    part = StateDirectory(tmp_path, CONFIG).partition("totals", 0)  # default bound: 30 s
    started = time.monotonic()

    part.open()

    waited = time.monotonic() - started
    try:
        assert 1.0 <= waited < 20, f"opened after {waited:.1f} s: it should wait for the ~2 s hand-over, no more"
        assert part.get(b"k") == b"held-and-released" and part.source_offset == 7
    finally:
        part.close()


def test_a_holder_that_never_lets_go_fails_the_opener_after_the_bound(tmp_path, stuck_holder):
    part = StateDirectory(tmp_path, CONFIG, lock_timeout_seconds=2).partition("totals", 0)
    started = time.monotonic()

    with pytest.raises(StateLockedError) as raised:
        part.open()

    waited = time.monotonic() - started
    assert 2 <= waited < 10, f"failed after {waited:.1f} s; the bound is 2 s"
    message = str(raised.value)
    assert f"pid {stuck_holder.pid}" in message and str(part.path) in message, message
    assert "2 s" in message and "stop it" in message, message
    assert stuck_holder.poll() is None, "the holder is unaffected"


def test_open_overrides_the_bound_and_zero_fails_at_once(tmp_path, stuck_holder):
    part = StateDirectory(tmp_path, CONFIG).partition("totals", 0)  # default bound: 30 s

    started = time.monotonic()
    with pytest.raises(StateLockedError, match=f"pid {stuck_holder.pid}"):
        part.open(lock_timeout=0)
    assert time.monotonic() - started < 1.0, "lock_timeout=0 (the restore job's skip_locked path) does not wait"

    started = time.monotonic()
    with pytest.raises(StateLockedError, match=f"pid {stuck_holder.pid}"):
        part.open(lock_timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 10

    with pytest.raises(ConfigurationError):
        StateDirectory(tmp_path, CONFIG, lock_timeout_seconds=-1)
