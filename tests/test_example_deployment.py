"""The example deployment: the code location loads, its assets materialize against the broker, and
the README's run command serves the UI and leaves nothing running after Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from dagster import materialize

from kafka_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def example_definitions(kafka_bootstrap, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.syspath_prepend(str(ROOT))
    import definitions

    return definitions.defs


def test_example_definitions_load_and_materialize(example_definitions):
    example_definitions.validate_loadable(example_definitions)
    assets = example_definitions.resolve_asset_graph().get_all_asset_keys()

    result = materialize([example_definitions.get_assets_def(key) for key in assets],
                         resources=example_definitions.resources)

    assert result.success
    metadata = result.asset_materializations_for_node("kafka_cluster")[0].metadata
    assert metadata["brokers"].value == 1


def test_run_command_serves_the_ui_and_stops_everything_on_ctrl_c(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if key != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(DAGSTER_PORT=str(port), DAGSTER_STATEFUL_DEV_DIR=str(tmp_path / "dev"),
               DAGSTER_STATEFUL_VENV=sys.prefix)
    output = open(tmp_path / "run-example.log", "wb")
    process = subprocess.Popen(["bash", str(ROOT / "scripts" / "run-example")], env=env, stdout=output,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/server_info"), 180,
                 f"the Dagster UI on port {port} (log: {tmp_path / 'run-example.log'})", interval=1.0)
        status = subprocess.run([sys.executable, "-m", "dagster_stateful.cli", "kafka", "status", "--home",
                                 str(tmp_path / "dev" / "kafka")], capture_output=True, text=True, check=False)
        assert status.returncode == 0, status.stdout

        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        output.close()
    log = (tmp_path / "run-example.log").read_text(errors="replace")
    assert f"Dagster UI: http://127.0.0.1:{port}" in log
    assert "stopped the Kafka broker" in log, log[-2000:]
    assert not _processes_mentioning(str(tmp_path / "dev")), "the broker outlived Ctrl-C"
    assert not _processes_mentioning(str(port)), "Dagster outlived Ctrl-C"
    assert not _answers(f"http://127.0.0.1:{port}/server_info")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
