"""Names of the Dagster objects built for an app, so assets, jobs, checks and sensors agree.

Owns the functions every module of the Dagster layer names things with: asset keys and groups,
as the app's `translator.StatefulTranslator` says (the default one unless given), and job,
schedule and sensor names (`<app>__<purpose>`, the app's name folded to what Dagster allows), and
the concurrency pools of worker identities.
"""

from __future__ import annotations

from dagster import AssetKey

from dagster_stateful.core.app import App
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator, python_name

__all__ = [
    "changelog_key",
    "group_name",
    "job_name",
    "python_name",
    "snapshot_key",
    "snapshot_keys",
    "snapshot_tables",
    "source_key",
    "store_key",
    "table_snapshot_key",
    "worker_pool",
]


def source_key(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_source_key(app)


def state_topic_key(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    """The asset of the topic whose partitions own the app's state: its repartition topic when it
    re-keys, else its source."""
    if app.config.repartition is not None:
        return translator.get_repartition_key(app)
    return translator.get_source_key(app)


def internal_topic_keys(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> list[AssetKey]:
    """The assets of the topics the app provisions: its repartition topic and its changelogs."""
    keys = [translator.get_repartition_key(app)] if app.config.repartition is not None else []
    if app.config.use_changelog_topics:
        keys += [translator.get_changelog_key(app, store) for store in app.stores]
    return keys


def changelog_key(app: App, store: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_changelog_key(app, store)


def store_key(app: App, store: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_store_key(app, store)


def table_store_key(app: App, table: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_table_store_key(app, table)


def snapshot_key(app: App, store: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_snapshot_key(app, store)


def table_snapshot_key(app: App, table: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetKey:
    return translator.get_table_snapshot_key(app, table)


def snapshot_tables(app: App) -> list[str]:
    """The partitioned tables of `app` that have snapshots: every one but the versioned (see
    `core.recovery.table_snapshots`)."""
    return [table for table in app.config.tables if not app.partitioned_table(table).versioned]


def snapshot_keys(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> list[AssetKey]:
    """The snapshot assets of `app`: its stores' (with changelog topics) and its tables'."""
    stores = app.stores if app.config.use_changelog_topics else []
    return [snapshot_key(app, store, translator) for store in stores] + [
        table_snapshot_key(app, table, translator) for table in snapshot_tables(app)
    ]


def group_name(app: App, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> str:
    return translator.get_group_name(app)


def job_name(app: App, purpose: str) -> str:
    """e.g. `order_totals__worker`, `order_totals__restore`."""
    return f"{python_name(app)}__{purpose}"


def worker_pool(app: App, member: int | None = None) -> str:
    """The Dagster concurrency pool of one worker identity, `<app>__worker` or, for member i of a
    worker pool, `<app>__worker_member_<i>`: with a pool limit of 1, no two runs hold one identity."""
    return job_name(app, "worker" if member is None else f"worker_member_{member}")
