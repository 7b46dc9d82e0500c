"""What an offset commit carries in its metadata (stream times, committed changelog ends), as pure logic."""

from __future__ import annotations

import pytest

from dagster_stateful.core import ConfigurationError
from dagster_stateful.core.processing.commit_metadata import (
    CommitMetadata,
    decode_commit_metadata,
    encode_commit_metadata,
)


def test_stream_times_read_back_as_written_in_the_format_older_releases_read():
    metadata = encode_commit_metadata({"per_minute": 1_700_000_000_123, "seen": -1}, 42, {})

    assert metadata.startswith("ds1:"), "without changelog ends, the format older releases read"
    assert decode_commit_metadata(metadata, 42, "orders[0]") == CommitMetadata(
        {"per_minute": 1_700_000_000_123, "seen": -1}
    )
    assert encode_commit_metadata({}, 42, {}) == "", "a commit of stores that keep no time carries nothing"


def test_changelog_ends_read_back_with_the_offset_they_were_committed_at():
    metadata = encode_commit_metadata({"per_minute": 7}, 42, {"totals": 1_000, "per_minute": 12})

    assert decode_commit_metadata(metadata, 42, "orders[0]") == CommitMetadata(
        {"per_minute": 7}, {"totals": 1_000, "per_minute": 12}, bare_uncommitted=True
    ), "records without headers past the ends are of uncommitted messages"


def test_ends_an_older_release_committed_leave_records_without_headers_committed():
    """Older releases wrote records without headers only for state written from outside the workers."""
    metadata = 'ds2:{"o": 42, "t": {}, "c": {"totals": 1000}}'

    assert decode_commit_metadata(metadata, 42, "orders[0]") == CommitMetadata({}, {"totals": 1_000})


@pytest.mark.parametrize("committed", [41, 43, 0, None], ids=["moved-back", "moved-on", "reset", "deleted"])
def test_changelog_ends_count_only_at_the_offset_they_were_committed_with(committed):
    """A tool that moves the group's offset and keeps the metadata must not make the ends claim records
    of messages past the new offset; the stream times still read."""
    metadata = encode_commit_metadata({"per_minute": 7}, 42, {"totals": 1_000})

    assert decode_commit_metadata(metadata, committed, "orders[0]") == CommitMetadata({"per_minute": 7}, {})


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "",
        "written by another client",
        "ds1:{not json",
        'ds1:{"a": "x"}',
        'ds1:{"a": true}',
        'ds2:{"o": 42, "t": {}, "c": {"totals": "x"}}',
        'ds2:{"o": 42, "t": {}}',
        "ds2:[1, 2]",
    ],
)
def test_metadata_in_another_form_reads_as_nothing(metadata, caplog):
    assert decode_commit_metadata(metadata, 42, "orders[3]") == CommitMetadata()
    if metadata and metadata.startswith(("ds1:", "ds2:")):
        assert "orders[3]" in caplog.text, "a damaged value is reported with where it was read"


def test_metadata_too_long_for_the_brokers_is_refused_with_what_to_do():
    with pytest.raises(ConfigurationError, match=r"offset\.metadata\.max\.bytes"):
        encode_commit_metadata({f"store-{i:04d}-" + "x" * 60: i for i in range(80)}, 42, {})
    with pytest.raises(ConfigurationError, match=r"offset\.metadata\.max\.bytes"):
        encode_commit_metadata({}, 42, {f"store-{i:04d}-" + "x" * 60: i for i in range(80)})
