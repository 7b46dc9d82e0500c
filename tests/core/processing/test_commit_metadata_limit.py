"""A broker whose `offset.metadata.max.bytes` is below what a commit's metadata takes (a broker of the
test's own, configured so).

The changelog ends only save restores reading headers: a commit the broker refuses for its metadata
is made again without them, and the run goes on exact. Stream times are needed: when even they do
not fit, the run ends with an error naming the limit and the stores, and nothing is committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from support.core_helpers import FAST_GROUP, add_to_total, expected_totals, make_orders, orders_topic

from dagster_stateful.core import App, State, Store
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, split_store_key
from dagster_stateful.core.state.ttl import split_expiry
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker

LIMIT = 120
"""Bytes of metadata the broker accepts: a TTL store's stream time fits, with its changelog end too."""
ORDERS = make_orders(200, customers=10)


@pytest.fixture(scope="module")
def small_metadata_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = BrokerSettings(properties={"offset.metadata.max.bytes": str(LIMIT)})
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("small-metadata"), settings)
    try:
        yield broker.start(tie_to_parent=True)
    finally:
        broker.stop()


def seen_and_totals(order: dict, state: State) -> dict:
    """A total per customer, kept in a store whose entries expire (so its commits carry a stream time)."""
    return add_to_total(order, state)


def totals(app: App, store: str) -> dict[str, int]:
    """Each customer's total in `store` (its values behind their expiry)."""
    partition = app.state.partition(store, 0)
    partition.open()
    try:
        content = [(split_store_key(key), value) for key, value in partition.items() if key != STREAM_TIME_KEY]
    finally:
        partition.close()
    return {key.decode(): orjson.loads(split_expiry(value)[1]) for (key, name), value in content if name == b"total"}


def ttl_app(bootstrap: str, source: str, state_dir: Path, name: str, store: str) -> App:
    app = App(
        name=name,
        source=source,
        stores=[Store(store, ttl=timedelta(days=30))],
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        commit_interval=0.5,
    )
    app.dataframe().apply(seen_and_totals, stateful=True, store=store)
    return app


def test_commits_leave_the_changelog_ends_out_when_the_broker_refuses_them(
    small_metadata_broker, unique_name, tmp_path, caplog
):
    """The store's name is long enough that its stream time and changelog end together pass the limit."""
    store = "totals-" + "x" * 50
    source = orders_topic(small_metadata_broker, unique_name("orders"), 1, ORDERS)
    app = ttl_app(small_metadata_broker, source, tmp_path, unique_name("ttl"), store)

    report = app.run_worker(max_seconds=120)

    assert report.committed_offsets == {0: len(ORDERS)}
    [(offset, metadata)] = app.kafka.committed(app.consumer_group, source, [0]).values()
    assert metadata is not None and len(metadata.encode()) <= LIMIT
    recorded = decode_commit_metadata(metadata, offset, source)
    assert set(recorded.stream_times) == {store} and recorded.changelog_ends == {}
    assert "offset.metadata.max.bytes" in caplog.text
    app.clear_state()
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    assert totals(app, store) == expected_totals(ORDERS), "restored from its changelog, exact"


def test_stream_times_the_broker_refuses_end_the_run_with_the_limit_and_the_stores(
    small_metadata_broker, unique_name, tmp_path
):
    store = "totals-" + "x" * 150
    source = orders_topic(small_metadata_broker, unique_name("orders"), 1, ORDERS)
    app = ttl_app(small_metadata_broker, source, tmp_path, unique_name("ttl"), store)

    with pytest.raises(ConfigurationError, match=rf"{store}.*offset\.metadata\.max\.bytes") as refused:
        app.run_worker(max_seconds=120)

    assert "raise offset.metadata.max.bytes" in str(refused.value)
    kafka = KafkaClients({"bootstrap.servers": small_metadata_broker})
    assert kafka.committed(app.consumer_group, source, [0]) == {0: (None, None)}, "nothing was committed"
