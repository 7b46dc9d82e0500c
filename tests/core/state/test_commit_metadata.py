"""What an offset commit carries in its metadata (stream times, committed changelog ends), as pure logic."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dagster_stateful.core import App, ConfigurationError, Store
from dagster_stateful.core.state.commit_metadata import (
    CommitMetadata,
    MetadataLimit,
    carried_over,
    check_metadata_fits,
    decode_commit_metadata,
    encode_commit_metadata,
)
from dagster_stateful.errors import MetadataVersionError


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


def test_a_commit_leaves_the_changelog_ends_out_before_its_metadata_passes_the_limit(caplog):
    """The ends only save restores reading headers: a commit whose metadata would not fit goes without.
    40 window stores named 40 characters long, at 19-digit times and offsets."""
    stores = [f"per-minute-{i:04d}-" + "x" * 25 for i in range(40)]
    times, ends = dict.fromkeys(stores, 10**18), dict.fromkeys(stores, 10**18)
    limit = MetadataLimit()

    metadata = limit.encode(times, 10**18, ends)

    assert decode_commit_metadata(metadata, 10**18, "orders[0]") == CommitMetadata(times)
    assert "offset.metadata.max.bytes" in caplog.text
    small = limit.encode({"per_minute": 7}, 42, {"totals": 5})
    assert decode_commit_metadata(small, 42, "orders[0]").changelog_ends == {"totals": 5}, "what fits stays"


def test_a_broker_that_refused_metadata_as_too_large_gets_shorter_metadata_after():
    limit = MetadataLimit()
    refused = limit.encode({"per_minute": 7}, 42, {"totals": 5})
    limit.refused(refused)

    assert len(limit.encode({"per_minute": 7}, 42, {"totals": 5})) < len(refused)
    limit.refused(limit.encode({"per_minute": 7}, 42, {"totals": 5}))
    with pytest.raises(ConfigurationError, match=r"stores \['per_minute'\].*offset\.metadata\.max\.bytes"):
        limit.encode({"per_minute": 7}, 42, {"totals": 5})


def test_stream_times_that_cannot_fit_are_refused_when_the_app_is_declared():
    """40 window stores named 80 characters long: their stream times alone pass 4096 bytes at the widest."""
    with pytest.raises(ConfigurationError, match=r"offset\.metadata\.max\.bytes"):
        check_metadata_fits(f"store-{i:04d}-" + "x" * 70 for i in range(40))
    check_metadata_fits(f"store-{i:04d}-" + "x" * 30 for i in range(40))


def test_the_app_refuses_ttl_stores_whose_stream_times_cannot_fit():
    stores = [Store(f"store-{i:04d}-" + "x" * 70, ttl=timedelta(hours=1)) for i in range(40)]
    with pytest.raises(ConfigurationError, match=r"offset\.metadata\.max\.bytes"):
        App("wide", source="orders", stores=stores, kafka={"bootstrap.servers": "127.0.0.1:9"})


@pytest.mark.parametrize(
    "metadata",
    ['ds2:{"v": 4, "o": 42, "t": {}, "c": {"totals": 10}, "h": 1}', 'ds3:{"o": 42}', "ds12:anything"],
    ids=["format-4", "prefix-3", "prefix-12"],
)
def test_metadata_of_a_later_changelog_format_is_refused_clearly(metadata):
    with pytest.raises(MetadataVersionError, match=r"orders\[3\].*later release"):
        decode_commit_metadata(metadata, 42, "orders[3]")


def test_this_release_writes_its_format_version():
    metadata = encode_commit_metadata({}, 42, {"totals": 5})
    assert '"v":3' in metadata
    assert decode_commit_metadata(metadata, 42, "orders[0]").changelog_ends == {"totals": 5}


@pytest.mark.parametrize("moved", [False, True], ids=["same-offset", "moved-offset"])
def test_an_offset_set_from_outside_keeps_the_other_stores_times_and_ends(moved):
    """A bootstrap of one store commits the group's offsets: the other stores keep their stream times,
    and their changelog ends while the offset stays."""
    before = encode_commit_metadata({"per_minute": 7, "boot": 9}, 42, {"totals": 100, "boot": 5})
    offset = 50 if moved else 42

    after = decode_commit_metadata(carried_over(before, 42, offset, "boot", "orders[0]"), offset, "orders[0]")

    assert after.stream_times == {"per_minute": 7}
    assert after.changelog_ends == ({} if moved else {"totals": 100})
