"""End to end in a real browser: the Dagster UI on the example deployment launches the worker job and
the run succeeds.

Runs `dg dev` on the example against the test broker and drives Debian's Chromium with
Playwright (its own browser download is never used).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from dagster_graphql import DagsterGraphQLClient
from kafka_helpers import answers_http, free_port, produce, wait_for
from playwright.sync_api import expect, sync_playwright

from dagster_stateful.core.kafka.clients import KafkaClients

ROOT = Path(__file__).resolve().parents[2]
LOCATION = "dagster-stateful-example"
CHROMIUM = os.environ.get("DAGSTER_STATEFUL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def dagster_ui(kafka_bootstrap, tmp_path):
    clients = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    if clients.partition_count("orders") is None:
        clients.create_topic("orders", 6, 1, {})
    produce(kafka_bootstrap, "orders", [(b"customer-001", orjson.dumps({"customer": "customer-001", "amount": 5}))])
    port = free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DAGSTER_HOME": str(home),
        "DAGSTER_STATEFUL_STATE_DIR": str(tmp_path / "state"),
    }
    log = open(tmp_path / "dagster-dev.log", "wb")  # noqa: SIM115 - the child writes to it until the end
    process = subprocess.Popen(
        [sys.executable, "-m", "dagster_dg_cli.cli", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: process.poll() is None and answers_http(f"http://127.0.0.1:{port}/server_info"),
            120,
            f"the Dagster UI (log: {tmp_path / 'dagster-dev.log'})",
            interval=0.5,
        )
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_worker_job_launched_from_the_ui_succeeds(dagster_ui, tmp_path):
    port = dagster_ui
    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.add_init_script("window.localStorage.setItem('communityNux', JSON.stringify('1'))")
            try:
                run_id = _launch_worker_run(page, base)
            except Exception as error:  # any failure in the UI gets a screenshot
                page.screenshot(path=str(tmp_path / "failure.png"))
                screenshot = tmp_path / "failure.png"
                raise AssertionError(f"the UI did not behave as expected; screenshot: {screenshot}") from error
        finally:
            browser.close()

    status = DagsterGraphQLClient("127.0.0.1", port_number=port).get_run_status(run_id)
    assert status.value == "SUCCESS"


def _launch_worker_run(page, base: str) -> str:
    page.goto(f"{base}/locations/{LOCATION}/jobs/order_totals__worker/playground", timeout=120_000)
    launch = page.get_by_role("button", name="Launch Run")
    expect(launch).to_be_enabled(timeout=120_000)
    launch.click()
    page.wait_for_url("**/runs/*", timeout=60_000)  # the launchpad opens the new run's page
    run_id = page.url.rstrip("/").split("/runs/")[1].split("?")[0]
    expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=180_000)
    return run_id
