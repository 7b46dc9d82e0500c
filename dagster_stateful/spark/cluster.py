"""A real Spark standalone cluster on 127.0.0.1, from the pyspark package's own launcher.

Owns `LocalSparkCluster`: a master (`spark-class org.apache.spark.deploy.master.Master`) and N
workers (`...deploy.worker.Worker`, each with its cores, memory and work directory), on free ports,
with their logs and a `spark.json` state file (pids, master URL) in a home directory; starting waits
until the master counts every worker alive, stopping sends SIGTERM, waits, then SIGKILL, so nothing
is left behind. Executors run in the workers' JVMs with Python workers of this interpreter
(`PYSPARK_PYTHON`), so the same jobs that run on `local[*]` run here with `spark.master` set to
`master_url`. No dagster import.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dagster_stateful.errors import LocalSparkError
from dagster_stateful.local_processes import find_java, free_ports, read_state_file, send_signal, write_state_file

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
STATE_FILE = "spark.json"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class SparkClusterStatus:
    running: bool
    master_url: str | None
    alive_workers: int
    expected_workers: int

    def describe(self) -> str:
        if not self.running:
            return "not running"
        return f"running: {self.master_url} ({self.alive_workers} of {self.expected_workers} workers alive)"


def spark_home() -> Path:
    """The pyspark package's directory: its `bin/spark-class` and `jars/` are a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).parent


class LocalSparkCluster:
    """A master and `workers` workers living in `home`. Usable as a context manager."""

    def __init__(self, home: Path | str, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        if workers < 1 or cores < 1:
            raise LocalSparkError(f"a Spark cluster needs at least one worker and one core, got {workers} and {cores}")
        self.home = Path(home).resolve()
        self.workers = workers
        self.cores = cores
        self.memory = memory

    def __enter__(self) -> LocalSparkCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def master_url(self) -> str:
        state = self._read_state()
        if state is None:
            raise LocalSparkError(f"no Spark cluster has been started from {self.home}")
        return str(state["master_url"])

    def start(self, timeout: float = 120.0) -> str:
        """Start the master and the workers (or find them running); returns the master URL."""
        current = self.status()
        if current.running and current.alive_workers == self.workers:
            return current.master_url or ""
        if current.running:
            self.stop()
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        port, web_port = free_ports(2)
        master_url = f"spark://{HOST}:{port}"
        pids = [
            self._launch("master", [MASTER_CLASS, "--host", HOST, "--port", str(port), "--webui-port", str(web_port)])
        ]
        self._write_state({"master_url": master_url, "web_port": web_port, "pids": pids, "workers": self.workers})
        for index in range(self.workers):
            work_dir = self.home / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            arguments = [WORKER_CLASS, "--host", HOST, "--cores", str(self.cores), "--memory", self.memory]
            arguments += ["--webui-port", "0", "--work-dir", str(work_dir), master_url]
            pids.append(self._launch(f"worker-{index}", arguments))
            self._write_state({"master_url": master_url, "web_port": web_port, "pids": pids, "workers": self.workers})
        try:
            self._wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("Spark cluster ready at %s with %d workers (home %s)", master_url, self.workers, self.home)
        return master_url

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every process of the cluster; returns whether any was running."""
        state = self._read_state()
        pids = [pid for pid in (state or {}).get("pids", []) if _alive(pid)]
        for pid in reversed(pids):  # the workers first, then the master
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                send_signal(pid, signal.SIGKILL)
        (self.home / STATE_FILE).unlink(missing_ok=True)
        return bool(pids)

    def status(self) -> SparkClusterStatus:
        state = self._read_state()
        if state is None or not any(_alive(pid) for pid in state.get("pids", [])):
            return SparkClusterStatus(False, None, 0, self.workers)
        return SparkClusterStatus(True, state["master_url"], self._alive_workers(state["web_port"]), state["workers"])

    def _launch(self, name: str, arguments: list[str]) -> int:
        environment = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "JAVA_HOME": os.environ.get("JAVA_HOME") or str(Path(find_java()).resolve().parent.parent),
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.home / "logs"),
        }
        with open(self.home / "logs" / f"{name}.log", "ab") as output:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *arguments],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        return process.pid

    def _wait_for_workers(self, timeout: float) -> None:
        state = self._read_state()
        assert state is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._alive_workers(state["web_port"]) >= self.workers:
                return
            if not all(_alive(pid) for pid in state["pids"]):
                break
            time.sleep(0.5)
        raise LocalSparkError(
            f"the Spark cluster in {self.home} did not have {self.workers} workers alive within {timeout:.0f} s; "
            f"see the logs in {self.home / 'logs'}"
        )

    @staticmethod
    def _alive_workers(web_port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{web_port}/json/", timeout=5) as response:
                return int(json.loads(response.read()).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def _read_state(self) -> dict | None:
        return read_state_file(self.home / STATE_FILE)

    def _write_state(self, state: dict) -> None:
        write_state_file(self.home / STATE_FILE, state)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
