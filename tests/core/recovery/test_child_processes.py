"""A restore's child process dies with the process that started it, though it is started without
forking a copy of its parent: a worker killed mid-restore leaves no replaying process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support.kafka_helpers import wait_for

PARENT = """
import subprocess, time
from dagster_stateful.core.recovery.child_processes import child_command
child = subprocess.Popen(child_command("busy_child"), stdin=subprocess.DEVNULL)
print(child.pid, flush=True)
time.sleep(120)
"""
BUSY_CHILD = """
import time


def main():
    time.sleep(120)  # a replay in progress: reading no pipe whose end would tell it the parent is gone
"""


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_busy_child_dies_when_its_parent_is_killed(tmp_path):
    (tmp_path / "busy_child.py").write_text(BUSY_CHILD)
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_for(lambda: b"busy_child" in Path(f"/proc/{child}/cmdline").read_bytes(), 10, "the child started")
        assert running(child), "the child works"

        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)

        wait_for(lambda: not running(child), 10, "the child to end with its parent", interval=0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
