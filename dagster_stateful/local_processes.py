"""Local processes the project starts for development and tests: Java, ports, signals, state files.

Owns finding a Java runtime (17+), picking and checking free ports on 127.0.0.1, signalling
processes (and tying a child to its parent's life), and the JSON state file a home directory keeps
about what runs from it, for the local Kafka broker and cluster and the local Spark cluster alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from dagster_stateful.errors import JavaNotFoundError, PortInUseError

HOST = "127.0.0.1"
MIN_JAVA_MAJOR = 17
LISTENING_PORT_FLOOR = 20000
EPHEMERAL_DEFAULT = (32768, 60999)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def find_java() -> str:
    """The `java` executable (JAVA_HOME first, then PATH), checked to be version 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    java = str(candidate) if candidate and candidate.exists() else shutil.which("java")
    if java is None:
        raise JavaNotFoundError(
            f"Java was not found (JAVA_HOME is {'unset' if not java_home else repr(java_home)} and there is no "
            f"`java` on PATH). The local Kafka broker and Spark cluster need Java {MIN_JAVA_MAJOR} or newer: "
            "install a JDK (e.g. `apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME, "
            "or point KAFKA_BOOTSTRAP_SERVERS at an existing cluster."
        )
    major = _java_major_version(java)
    if major < MIN_JAVA_MAJOR:
        raise JavaNotFoundError(
            f"{java} is Java {major}; the local Kafka broker and Spark cluster need Java {MIN_JAVA_MAJOR}+. "
            "Install a newer JDK or set JAVA_HOME to one."
        )
    return java


def _java_major_version(java: str) -> int:
    output = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if match is None:
        raise JavaNotFoundError(f"could not read the version of {java}; it printed: {output.strip()[:300]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports on 127.0.0.1."""
    ports: list[int] = []
    while len(ports) < count:
        ports.append(free_port(avoid=set(ports)))
    return ports


def free_port(avoid: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """A port nothing is bound to, chosen below the kernel's ephemeral range: a port the kernel hands
    out (bind to 0) lies inside that range, where any outgoing connection, the brokers' own among
    them, may take it as its local port between the choice and the listener's bind."""
    low, high = _listening_port_range()
    for _ in range(1000):
        port = random.randint(low, high)
        if port not in avoid and _bindable(port):
            return port
    raise PortInUseError(f"no free port on {HOST} between {low} and {high} after 1000 tries")


def _listening_port_range() -> tuple[int, int]:
    """Ports for listeners: from 20000 up to just below the ephemeral range (32768-60999 on Linux
    by default), or above the range when it starts too low to leave room."""
    ephemeral_low, ephemeral_high = EPHEMERAL_DEFAULT
    with contextlib.suppress(OSError, ValueError):
        ephemeral_low, ephemeral_high = map(int, EPHEMERAL_RANGE_FILE.read_text().split())
    if ephemeral_low - 1 >= LISTENING_PORT_FLOOR + 1000:
        return LISTENING_PORT_FLOOR, ephemeral_low - 1
    return ephemeral_high + 1, 65535


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def check_port_free(port: int, purpose: str) -> int:
    """Refuse a port another socket listens on or is bound to. The probe binds with SO_REUSEADDR, as
    the broker's own listeners do, so connections of a broker just stopped (left in TIME_WAIT for
    about a minute) do not block a restart on the same port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {HOST} (wanted for the broker's {purpose} listener) is already in use; "
                    f"stop what holds it (`ss -ltnp 'sport = :{port}'` shows it) or leave the port unset "
                    "to pick a free one"
                ) from error
            raise
    return port


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((HOST, port)) == 0


def send_signal(pid: int, signum: int) -> None:
    """`signum` to `pid`, unless it is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def launch(
    command: list[str], log_file: Path, tie_to_parent: bool = True, cwd: Path | None = None, env: dict | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a session of its own, its output (both streams) to `log_file`; with
    `tie_to_parent`, it is sent SIGTERM when this process dies."""
    with open(log_file, "wb") as output:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent if tie_to_parent else None,
        )


def read_state_file(path: Path) -> dict | None:
    """The JSON state file at `path`; None when there is none or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_state_file(path: Path, state: dict) -> None:
    """Replace the JSON state file at `path` atomically (write a temporary file, then rename)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(path)
