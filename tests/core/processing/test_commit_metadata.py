"""The stream times an offset commit carries in its metadata, as pure logic."""

from __future__ import annotations

import pytest

from dagster_stateful.core import ConfigurationError
from dagster_stateful.core.processing.commit_metadata import decode_stream_times, encode_stream_times


def test_stream_times_read_back_as_written():
    metadata = encode_stream_times({"per_minute": 1_700_000_000_123, "seen": -1})

    assert decode_stream_times(metadata, "orders[0]") == {"per_minute": 1_700_000_000_123, "seen": -1}
    assert encode_stream_times({}) == "", "a commit of stores that keep no time carries nothing"


@pytest.mark.parametrize("metadata", [None, "", "written by another client", "ds1:{not json", 'ds1:{"a": "x"}'])
def test_metadata_in_another_form_reads_as_no_stream_times(metadata, caplog):
    assert decode_stream_times(metadata, "orders[3]") == {}
    if metadata and metadata.startswith("ds1:"):
        assert "orders[3]" in caplog.text, "a damaged value is reported with where it was read"


def test_stream_times_too_long_for_the_brokers_are_refused_with_what_to_do():
    with pytest.raises(ConfigurationError, match=r"offset\.metadata\.max\.bytes"):
        encode_stream_times({f"store-{i:04d}-" + "x" * 60: i for i in range(80)})
