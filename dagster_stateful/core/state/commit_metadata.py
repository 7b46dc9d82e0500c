"""What a source offset commit carries besides the offset: stream times and committed changelog ends.

Owns the format of the commit's metadata string. Two things ride in it, per store:

- **Stream time** (window and TTL stores). Kafka Streams keeps a task's partition time in the
  metadata of its offset commit; so does this engine, so that the stream time of the last commit is
  known exactly when the partition is taken up again, even after compaction removed its committed
  record from the changelog (a crash between delivering a commit's changelog and committing the
  source leaves a newer, uncommitted one). Messages processed again are judged by it: a stream time
  advanced by work that was never committed would take them for late.
- **Committed changelog end** (at-least-once). Where the store's changelog partition ended once
  the commit's records were acknowledged, when the committing worker knows that every record
  below it is of a message processed before the committed offset (`processing.changelog_positions`).
  A restore takes the records below it without reading their headers. A commit that records ends
  also says (`"h": 1`) that a record without any header outside a block at or past its store's end
  is of an uncommitted message (`changelog_format`: the rule of the release before blocks, which
  wrote such records only in commits that recorded their end). Metadata without `"h"` (an older
  engine's) leaves such records counted as committed, as that engine wrote them only for state
  written from outside. Nothing else depends on the ends: a commit may leave them out.

- **Table positions** (partitioned tables, `processing.worker.tables`). Entries named `table:<name>`
  beside the stream times hold the offset of the next record of table `<name>`'s partition that
  the commit had not yet applied; the entry `join:stream-time` the stream time of the records
  joining a versioned table with a grace; `stream:<name>` the position of a joined stream's
  partition (`processing.worker.joined_streams`); `fk:<table>:<partition>` how far a foreign-key
  join has taken in that partition of its right table (`processing.worker.foreign_key_joins`).
  Store names cannot hold ':', so no store takes these.

Format: `"ds1:"` and a JSON object, store name to stream time in ms, when no changelog end is
known; otherwise `"ds2:"` and a JSON object `{"v": 3, "o": <the committed offset>, "t": {store:
stream time}, "c": {store: changelog end}, "h": 1}`. The changelog ends count only while `"o"` is
the committed offset itself: a tool that moves the offset and keeps the metadata cannot make them
claim records of messages past it. `"h"` tells releases that wrote records without headers before
blocks (`recovery.changelog_format`) that such records past the end are uncommitted, which stays
true of blocks; this release never needs the metadata to tell a record's commit.

`"v"` is the changelog format the committing release wrote: a release meeting a higher one (or a
prefix past `"ds2:"`) refuses to start the partition (`MetadataVersionError`), instead of guessing
what records it cannot read mean. Metadata in another form (written by another client, or none)
reads as nothing: each store's own stream time is used, and restores read every header.

The broker refuses metadata longer than its `offset.metadata.max.bytes` (4096 by default). The
stream times are needed and must fit (`check_metadata_fits`, when the app is declared); the
changelog ends only save restores reading headers, so a commit whose metadata would not fit leaves
them out (`MetadataLimit`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

import orjson

from dagster_stateful.errors import ConfigurationError, MetadataVersionError

log = logging.getLogger(__name__)

PREFIX = "ds1:"
PREFIX_WITH_ENDS = "ds2:"
FORMAT_VERSION = 3
"""The changelog format this release writes and reads: 3, blocks (`recovery.changelog_format`)."""
MAX_METADATA_BYTES = 4096
"""The brokers' default `offset.metadata.max.bytes`: a commit with longer metadata is refused."""
WIDEST_OFFSET = 2**63 - 1
"""The widest offset or timestamp a commit may carry (19 digits)."""


TABLE_ENTRY_PREFIX = "table:"
JOIN_STREAM_TIME = "join:stream-time"
"""The metadata entry of the stream time the grace of a versioned table join is measured in."""


STREAM_ENTRY_PREFIX = "stream:"
FOREIGN_KEY_ENTRY_PREFIX = "fk:"


def stream_entry(stream: str) -> str:
    """The metadata entry of a joined stream's position (the next of its records to process)."""
    return STREAM_ENTRY_PREFIX + stream


def foreign_key_entry(table: str, partition: int) -> str:
    """The metadata entry of how far a foreign-key join has taken in partition `partition` of right table `table`."""
    return f"{FOREIGN_KEY_ENTRY_PREFIX}{table}:{partition}"


def table_entry(table: str) -> str:
    """The metadata entry of `table`'s position (table names, as store names, hold no ':')."""
    return TABLE_ENTRY_PREFIX + table


@dataclass(frozen=True)
class CommitMetadata:
    stream_times: dict[str, int] = field(default_factory=dict)
    """Store name to the stream time (ms) the commit recorded."""
    changelog_ends: dict[str, int] = field(default_factory=dict)
    """Store name to a changelog offset below which every record is of a committed message."""
    bare_uncommitted: bool = False
    """Whether a record without headers (outside a block) at or past its store's changelog end is of an
    uncommitted message."""


class MetadataLimit:
    """How long a commit's metadata may be: the brokers' `offset.metadata.max.bytes`, or less once the
    broker refused a commit's metadata as too large (`refused`)."""

    def __init__(self, limit: int = MAX_METADATA_BYTES) -> None:
        self.limit = limit
        self._warned = False

    def refused(self, metadata: str) -> None:
        """The broker refused `metadata` as too large: later commits stay below its length."""
        self.limit = min(self.limit, len(metadata.encode()) - 1)

    def encode(self, stream_times: Mapping[str, int], offset: int, changelog_ends: Mapping[str, int]) -> str:
        """The metadata of a commit at source `offset` ("" when there is nothing to carry); its changelog
        ends are left out when the whole would not fit. Raises `ConfigurationError` when the stream
        times alone do not fit."""
        metadata = encode_commit_metadata(stream_times, offset, changelog_ends)
        if len(metadata.encode()) <= self.limit:
            return metadata
        needed = encode_commit_metadata(stream_times, offset, {})
        if len(needed.encode()) > self.limit:
            raise ConfigurationError(
                f"the stream times of stores {sorted(stream_times)} take {len(needed.encode())} bytes in the offset "
                f"commit's metadata, more than the {self.limit} bytes the brokers accept (offset.metadata.max.bytes): "
                "give the window and TTL stores shorter names, fewer of them per app, or raise "
                "offset.metadata.max.bytes on every broker"
            )
        if not self._warned:
            self._warned = True
            log.warning(
                "The metadata of a commit of stores %s would take %d bytes, more than the %d the brokers accept "
                "(offset.metadata.max.bytes): commits leave the stores' changelog ends out, and restores read every "
                "record's headers (slower, as exact)",
                sorted(set(stream_times) | set(changelog_ends)),
                len(metadata.encode()),
                self.limit,
            )
        return needed


def check_metadata_fits(clocked_stores: Iterable[str], limit: int = MAX_METADATA_BYTES) -> None:
    """Refuse, when the app is declared, window and TTL stores whose stream times cannot fit in a
    commit's metadata whatever the offsets and times grow to."""
    stores = sorted(clocked_stores)
    if stores:
        MetadataLimit(limit).encode(dict.fromkeys(stores, WIDEST_OFFSET), WIDEST_OFFSET, {})


def encode_commit_metadata(stream_times: Mapping[str, int], offset: int, changelog_ends: Mapping[str, int]) -> str:
    """The metadata of a commit at source `offset` ("" when there is nothing to carry)."""
    if changelog_ends:
        body = {"v": FORMAT_VERSION, "o": offset, "t": dict(stream_times), "c": dict(changelog_ends), "h": 1}
        return PREFIX_WITH_ENDS + orjson.dumps(body).decode()
    if stream_times:
        return PREFIX + orjson.dumps(dict(stream_times)).decode()
    return ""


def carried_over(metadata: str | None, committed: int | None, offset: int, replaced: str, where: str) -> str:
    """The metadata an offset set from outside the workers (a bootstrap of store `replaced`) commits at
    `offset`, from the group's metadata at `committed`: every other store keeps its stream time and,
    while the offset stays where it was, its changelog end."""
    recorded = decode_commit_metadata(metadata, committed, where)
    stream_times = {store: time for store, time in recorded.stream_times.items() if store != replaced}
    ends = recorded.changelog_ends if committed == offset else {}
    return encode_commit_metadata(
        stream_times, offset, {store: end for store, end in ends.items() if store != replaced}
    )


def decode_commit_metadata(metadata: str | None, offset: int | None, where: str) -> CommitMetadata:
    """What a commit at source `offset` recorded in its `metadata` (nothing when it is not in this
    format). `where` names the topic partition, for the warning a damaged value gets; metadata of a
    later changelog format raises `MetadataVersionError`."""
    if not metadata:
        return CommitMetadata()
    _refuse_later_format(metadata, where)
    if not metadata.startswith((PREFIX, PREFIX_WITH_ENDS)):
        return CommitMetadata()
    try:
        decoded = orjson.loads(metadata[len(PREFIX) :])
    except orjson.JSONDecodeError:
        decoded = None
    if metadata.startswith(PREFIX):
        if _is_int_map(decoded):
            return CommitMetadata(stream_times=decoded)
    elif isinstance(decoded, dict) and _is_int_map(decoded.get("t")) and _is_int_map(decoded.get("c")):
        _refuse_later_version(decoded.get("v"), where)
        ends = decoded["c"] if decoded.get("o") == offset and offset is not None else {}
        bare_uncommitted = bool(ends) and decoded.get("h") == 1
        return CommitMetadata(stream_times=decoded["t"], changelog_ends=ends, bare_uncommitted=bare_uncommitted)
    log.warning(
        "The committed offset of %s carries metadata this engine cannot read (%.80r); the stores' own stream "
        "times are used and restores read every changelog record's header",
        where,
        metadata,
    )
    return CommitMetadata()


def _refuse_later_format(metadata: str, where: str) -> None:
    """Raise for a `"dsN:"` prefix of a later release (N above 2)."""
    head, colon, _ = metadata.partition(":")
    if colon and head.startswith("ds") and head[2:].isdigit() and int(head[2:]) > 2:
        _refuse(f"prefix {head!r}", where)


def _refuse_later_version(version: object, where: str) -> None:
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        _refuse(f"changelog format {version}", where)


def _refuse(what: str, where: str) -> NoReturn:
    raise MetadataVersionError(
        f"the committed offset of {where} was written by a later release of dagster-stateful ({what}; this release "
        f"reads changelog format {FORMAT_VERSION} and older): this release cannot tell which changelog records that "
        "release committed, so it restores and processes nothing. Run the later release (every worker of the app "
        "must run it once any does), or follow its documented roll-back, which makes the metadata readable again."
    )


def _is_int_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(number, int) and not isinstance(number, bool)
        for name, number in value.items()
    )
