"""App configuration: validated once, frozen, with clear errors naming the setting."""

from __future__ import annotations

import dataclasses

import pytest

from dagster_stateful.core import App, AppConfig, ConfigurationError, ErrorPolicy, JsonSerde, ProcessingGuarantee


def test_settings_are_resolved_and_frozen():
    config = AppConfig(name="totals", source="orders", stores=["a", "b"], on_error="dead-letter")  # type: ignore[arg-type]

    assert config.stores == ("a", "b") and config.on_error is ErrorPolicy.DEAD_LETTER
    assert isinstance(config.value_serde, JsonSerde)
    assert config.changelog_config["cleanup.policy"] == "compact"
    assert config.changelog_topics() == {"a": "totals-a-changelog", "b": "totals-b-changelog"}
    assert config.dead_letter_topic == "totals-dead-letter" and config.consumer_group == "totals"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"name": "bad name"}, "app name 'bad name'"),
        ({"stores": ["x", "x"]}, "distinct store names"),
        ({"stores": []}, "distinct store names"),
        ({"on_error": "ignore"}, "on_error='ignore' is not one of 'raise', 'skip', 'dead-letter'"),
        (
            {"processing_guarantee": "exactly-once", "commit_interval": 40},
            "commit_interval 40 s is too long for transaction.timeout.ms 60000 ms",
        ),
        (
            {"processing_guarantee": "exactly-once", "producer_config": {"transactional.id": "mine"}},
            "producer_config must not set transactional.id",
        ),
        ({"processing_guarantee": "at-most-once"}, "processing_guarantee='at-most-once'"),
        ({"value_serde": "avro"}, "unknown serializer 'avro'"),
        ({"commit_interval": 0}, "commit_interval and commit_every must be positive"),
        ({"restore_batch_size": 0}, "restore_batch_size must be positive"),
        ({"cache_max_bytes": -1}, "cache_max_bytes must be 0 or more, got -1"),
        ({"num_standby_replicas": -1}, "num_standby_replicas is 0 or more, got -1"),
        (
            {"num_standby_replicas": 1, "use_changelog_topics": False},
            "keeps standby replicas, which read the changelogs: it needs use_changelog_topics",
        ),
    ],
)
def test_bad_settings_raise_a_configuration_error_naming_them(settings, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        App(**{"name": "totals", "source": "orders", "kafka": "127.0.0.1:9", **settings})


def test_without_changelogs_the_app_warns_and_has_no_changelog_topics(caplog):
    app = App(name="totals", source="orders", kafka="127.0.0.1:9", use_changelog_topics=False)

    assert app.config.changelog_topics() is None
    assert "cannot be recovered" in caplog.text


def test_to_topic_records_the_output_in_a_new_configuration():
    app = App(name="totals", source="orders", kafka="127.0.0.1:9")
    before = app.config
    app.to_topic(app.dataframe(), "totals-out")

    assert app.config.output == "totals-out" and app.config.emits_output
    assert before.output is None and not before.emits_output, "configurations never change in place"
    assert app.config.processing_guarantee is ProcessingGuarantee.AT_LEAST_ONCE
