"""End to end in a real browser: what the Dagster UI shows on the example deployment is true at a
glance. A worker launched from the UI succeeds; the store's page shows its check's result and the
automation that runs its worker, and plots its store metrics and the sensor's lag; changelogs are materialized and
their checks evaluated; the catalog shows whole names; the shared topic sits in a group of its own;
re-provisioning leaves the stores in sync; a worker schedule with no lag skips and says why; a run
with nothing to do records no materialization.

Runs `dg dev` on the example against the test broker and drives Debian's Chromium with
Playwright (its own browser download is never used). The order generator and the snapshot
sensors (Spark) are switched off through the UI's API, so the only orders are the test's. The
tests share one deployment and run in this file's order; those that wait on the daemon (the
schedule's tick, the checks the first worker run's materialization triggers) come last, so that
its work overlaps the others (each still waits for what it checks, with a timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import Page, expect, sync_playwright
from support.kafka_helpers import answers_http, free_port, produce, wait_for

from dagster_stateful.core.kafka.clients import KafkaClients

ROOT = Path(__file__).resolve().parents[2]
LOCATION = "dagster-stateful-example"
REPOSITORY = "__repository__"
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
EXPECT_TIMEOUT_MS = 30_000
"""How long an assertion on the page waits (Playwright's default, 5 s, is too short for a loaded
2-core machine rendering Dagster's pages; a fresh-clone run found pages still empty after it)."""
expect.set_options(timeout=EXPECT_TIMEOUT_MS)
STORE = "/assets/order_totals/totals_store"
CHANGELOG = "/assets/order_totals/totals_changelog"
TIERS_AUTOMATION = ["order_tiers__lag_sensor", "order_tiers__rebalance_sensor", "order_tiers__checks_sensor"]
"""The app `order-tiers` is not under test here: without the generator, its `customers` topic does not
exist, and its worker runs would fail every minute while taking the cores the tests' runs need."""
SESSIONS_AUTOMATION = [
    "order_sessions__lag_sensor",
    "order_sessions__rebalance_sensor",
    "order_sessions__checks_sensor",
    "order_sessions__snapshot_sensor",
]
"""Nor is the app `order-sessions`: its workers would take the cores the tests' runs need."""
SWITCHED_OFF = {
    "schedule": ["generate_orders_every_minute", "order_tiers__worker_schedule", "order_sessions__worker_schedule"],
    "sensor": [
        "order_totals__snapshot_sensor",
        "order_counts__snapshot_sensor",
        "order_tiers__snapshot_sensor",
        *TIERS_AUTOMATION,
        *SESSIONS_AUTOMATION,
    ],
}


@dataclass
class UI:
    base: str
    client: DagsterGraphQLClient
    page: Page
    screenshots: Path

    def open(self, path: str) -> Page:
        self.page.goto(f"{self.base}{path}", timeout=120_000)
        return self.page

    def launch_worker(self) -> str:
        """Launch the worker job from its launchpad; returns the run id once the run succeeded."""
        page = self.open(f"/locations/{LOCATION}/jobs/order_totals__worker/playground")
        launch = page.get_by_role("button", name="Launch Run")
        expect(launch).to_be_enabled(timeout=120_000)
        launch.click()
        page.wait_for_url("**/runs/*", timeout=60_000)  # the launchpad opens the new run's page
        run_id = page.url.rstrip("/").split("/runs/")[1].split("?")[0]
        # On 2 busy cores a run can take minutes although its step takes seconds: the daemon's check
        # runs and the other app's worker start their Dagster processes at the same moment.
        expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=360_000)
        return run_id


def _graphql(base: str, query: str, variables: dict | None = None) -> dict:
    """The `data` of a query to the UI's GraphQL API (for what the UI's own client has no call)."""
    request = urllib.request.Request(
        f"{base}/graphql",
        data=orjson.dumps({"query": query, "variables": variables or {}}),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = orjson.loads(response.read())
    assert not answer.get("errors"), answer["errors"]
    return answer["data"]


def _switch_off(base: str, kind: str, name: str) -> None:
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, f"{kind}Name": name}
    found = _graphql(
        base,
        f"query($s: {kind.capitalize()}Selector!) {{ {kind}OrError({kind}Selector: $s) {{ ... on {kind.capitalize()} "
        "{ id } } }",
        {"s": selector},
    )
    instigator_id = found[f"{kind}OrError"]["id"]
    mutation = "stopRunningSchedule" if kind == "schedule" else "stopSensor"
    _graphql(base, f"mutation($id: String) {{ {mutation}(id: $id) {{ __typename }} }}", {"id": instigator_id})


@pytest.fixture(scope="module")
def ui(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    work = tmp_path_factory.mktemp("ui")
    clients = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    if clients.partition_count("orders") is None:
        clients.create_topic("orders", 6, 1, {})
    orders = [(f"customer-{i:03d}", {"customer": f"customer-{i:03d}", "amount": 5}) for i in range(12)]
    produce(kafka_bootstrap, "orders", [(key.encode(), orjson.dumps(order)) for key, order in orders])
    port = free_port()
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DAGSTER_HOME": str(home),
        "DAGSTER_STATEFUL_STATE_DIR": str(work / "state"),
        "DAGSTER_STATEFUL_SNAPSHOT_ROOT": str(work / "snapshots"),
    }
    log = open(work / "dagster-dev.log", "wb")  # noqa: SIM115 - the child writes to it until the end
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
            f"the Dagster UI (log: {work / 'dagster-dev.log'})",
            interval=0.5,
        )
        base = f"http://127.0.0.1:{port}"
        for kind, names in SWITCHED_OFF.items():
            for name in names:
                _switch_off(base, kind, name)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1920, "height": 1080})
                page.add_init_script("window.localStorage.setItem('communityNux', JSON.stringify('1'))")
                page.set_default_timeout(60_000)
                yield UI(base, DagsterGraphQLClient("127.0.0.1", port_number=port), page, work)
            finally:
                browser.close()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def screenshot_on_failure(ui: UI, request: pytest.FixtureRequest) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        path = ui.screenshots / f"{request.node.name}.png"
        ui.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot of the page at the failure: {path}")  # noqa: T201 - pytest shows it with the failure


pytestmark = [pytest.mark.usefixtures("screenshot_on_failure"), pytest.mark.alone]


def test_a_worker_launched_from_the_ui_succeeds(ui: UI):
    run_id = ui.launch_worker()

    assert ui.client.get_run_status(run_id).value == "SUCCESS"


def test_the_store_page_shows_its_check_passed_and_the_automation_that_runs_its_worker(ui: UI):
    page = ui.open(STORE)

    expect(page.get_by_text("Automation details")).to_be_visible()
    expect(page.get_by_text("No automations found for this asset")).to_have_count(0)
    expect(page.get_by_text("order_totals__lag_sensor").first).to_be_visible()
    expect(page.get_by_text("Every minute").first).to_be_visible()
    page = ui.open(f"{STORE}?view=checks")
    expect(page.get_by_text("local_state_fresh").first).to_be_visible()
    expect(page.get_by_text("Passed", exact=True).first).to_be_visible()
    expect(page.get_by_text("Not evaluated")).to_have_count(0)
    for measured in ("largest_changelog_lag", "changelog_lag_limit"):
        expect(page.get_by_text(measured, exact=True).first).to_be_visible()


def test_the_snapshot_page_shows_the_sensor_that_takes_the_first_snapshot_within_minutes(ui: UI):
    page = ui.open("/assets/order_totals/totals_snapshot")

    expect(page.get_by_text("Automation details")).to_be_visible()
    expect(page.get_by_text("order_totals__snapshot_sensor").first).to_be_visible()


def test_the_store_page_plots_the_store_metrics_and_the_lag_sensors_observations(ui: UI):
    def plotted() -> bool:
        page = ui.open(STORE)
        page.get_by_role("button", name="Plots").first.click()
        page.get_by_role("button", name="Events").first.click()
        # the materializations' plots come first: once they show, every plot has loaded
        expect(page.get_by_text("messages_processed", exact=True).first).to_be_visible(timeout=120_000)
        for metric in ("store.get_count", "store.get_p99_ms", "store.cache_hit_ratio", "commit_p99_ms"):
            expect(page.get_by_text(metric, exact=True).first).to_be_visible()
        return page.get_by_text("lag", exact=True).count() > 0

    wait_for(plotted, 300, "a plot of `lag`, the lag sensor's observations, on the store's page", interval=5)


def test_the_catalog_shows_every_name_whole(ui: UI):
    page = ui.open("/assets")
    names = page.locator("a[href^='/assets/'] div[title] > span")
    expect(names.first).to_be_visible()
    page.wait_for_timeout(2_000)  # the names are cut to fit once the table is laid out

    shown = {
        names.nth(i).locator("xpath=..").get_attribute("title"): names.nth(i).inner_text() for i in range(names.count())
    }

    assert len(shown) >= 10, shown
    cut = {whole: seen for whole, seen in shown.items() if seen != whole}
    assert not cut, f"names cut off in the catalog at 1920 pixels: {cut}"


def test_the_shared_topic_sits_in_its_own_group_and_draws_no_edge_between_apps(ui: UI):
    page = ui.open("/assets/kafka/orders")
    readers = "read by apps order-totals, order-counts, order-tiers, order-sessions"
    expect(page.get_by_text(readers).first).to_be_visible()
    expect(page.locator("""a[href*='group%3A"kafka"']""").first).to_be_visible()

    page = ui.open(f"/locations/{LOCATION}/asset-groups/order_totals/lineage")
    expect(page.get_by_text("totals_store").first).to_be_visible()
    for other_app in ("per_minute", "seen_store", "order_counts"):
        expect(page.get_by_text(other_app)).to_have_count(0)


def test_a_worker_run_with_nothing_to_do_records_no_materialization(ui: UI):
    run_id = ui.launch_worker()

    expect(ui.page.get_by_text("Nothing to do").first).to_be_visible()
    events = _graphql(
        ui.base,
        "query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection { events { __typename } } } } }",
        {"id": run_id},
    )["runOrError"]["eventConnection"]["events"]
    kinds = {event["__typename"] for event in events}
    assert "MaterializationEvent" not in kinds, f"the run with nothing to do recorded a materialization: {kinds}"


def test_a_worker_schedule_tick_without_lag_skips_and_says_why(ui: UI):
    schedule = f"/locations/{LOCATION}/schedules/order_totals__worker_schedule"

    def skipped_for_no_lag() -> bool:
        page = ui.open(schedule)
        ticks = page.locator("table").last.locator("tbody tr")
        expect(ticks.first).to_be_visible()
        for index in range(min(ticks.count(), 3)):
            ticks.nth(index).locator("td").nth(1).locator("*").first.hover()
            reason = page.get_by_text("no lag: group order-totals has processed every message")
            try:
                expect(reason.first).to_be_visible(timeout=5_000)  # the tooltip shows after a delay
                return True
            except AssertionError:
                continue
        return False

    wait_for(skipped_for_no_lag, 150, "a worker schedule tick skipped with the reason 'no lag'", interval=10)


def test_the_changelog_is_materialized_and_its_checks_evaluated(ui: UI):
    page = ui.open(CHANGELOG)
    expect(page.get_by_text("Latest materialization").first).to_be_visible()
    expect(page.get_by_text("Never materialized")).to_have_count(0)

    def every_check_passed() -> bool:
        page = ui.open(f"{CHANGELOG}?view=checks")
        expect(page.get_by_text("Checks (5)")).to_be_visible(timeout=60_000)  # a loaded machine renders it late
        page.wait_for_timeout(2_000)
        return page.get_by_text("Succeeded", exact=True).count() == 5

    wait_for(every_check_passed, 240, "the changelog's five checks, evaluated after its materialization", interval=5)


def test_provisioning_again_leaves_the_stores_in_sync(ui: UI):
    page = ui.open(f"/locations/{LOCATION}/jobs/order_totals__provision/playground")
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url("**/runs/*", timeout=60_000)
    expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=120_000)

    page = ui.open(f"{STORE}?view=partitions")
    expect(page.get_by_text("Materialized (6)").first).to_be_visible()
    page.wait_for_timeout(3_000)
    expect(page.get_by_text("Unsynced")).to_have_count(0)
    page = ui.open(STORE)
    expect(page.get_by_text("Latest materialization").first).to_be_visible()
    expect(page.get_by_text("Unsynced")).to_have_count(0)
