"""Names of the Dagster objects built for an app, so assets, jobs, checks and sensors agree.

Owns asset keys (topics under `kafka/topics/<topic>`, stores under `state/<app>/<store>`, snapshots
under `snapshots/<app>/<store>`), the app's asset group, and job, schedule and sensor names. Dagster
object names allow only letters, digits and underscores, so app names are folded to that.
"""

from __future__ import annotations

import re

from dagster import AssetKey

from dagster_stateful.core.app import App


def python_name(app: App) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", app.name)


def topic_key(topic: str) -> AssetKey:
    return AssetKey(["kafka", "topics", topic])


def source_key(app: App) -> AssetKey:
    return topic_key(app.source)


def changelog_key(app: App, store: str) -> AssetKey:
    return topic_key(app.changelog_topic(store))


def store_key(app: App, store: str) -> AssetKey:
    return AssetKey(["state", app.name, store])


def snapshot_key(app: App, store: str) -> AssetKey:
    return AssetKey(["snapshots", app.name, store])


def group_name(app: App) -> str:
    return python_name(app)


def job_name(app: App, purpose: str) -> str:
    """e.g. `order_totals__worker`, `order_totals__restore`."""
    return f"{python_name(app)}__{purpose}"
