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
  A restore takes the records below it without reading their `source_offset` header. A commit
  that records ends also says (`"h": 1`) that a record without any header at or past its store's
  end is of an uncommitted message: a worker writes records without the header only in commits
  that record their end (`changelog_format`), so such a record past the end is of a commit whose
  offset was never committed. Metadata without `"h"` (an older engine's) leaves such records
  counted as committed, as that engine wrote them only for state written from outside.

Format: `"ds1:"` and a JSON object, store name to stream time in ms, when no changelog end is
known; otherwise `"ds2:"` and a JSON object `{"o": <the committed offset>, "t": {store: stream
time}, "c": {store: changelog end}, "h": 1}`. The changelog ends count only while `"o"` is the committed
offset itself: a tool that moves the offset and keeps the metadata cannot make them claim records
of messages past it. Metadata in another form (written by another client, or none) reads as
nothing: each store's own stream time is used, and restores read every header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)

PREFIX = "ds1:"
PREFIX_WITH_ENDS = "ds2:"
MAX_METADATA_BYTES = 4096
"""The brokers' default `offset.metadata.max.bytes`: a commit with longer metadata is refused."""


@dataclass(frozen=True)
class CommitMetadata:
    stream_times: dict[str, int] = field(default_factory=dict)
    """Store name to the stream time (ms) the commit recorded."""
    changelog_ends: dict[str, int] = field(default_factory=dict)
    """Store name to a changelog offset below which every record is of a committed message."""
    bare_uncommitted: bool = False
    """Whether a record without headers at or past its store's changelog end is of an uncommitted message."""


def encode_commit_metadata(stream_times: Mapping[str, int], offset: int, changelog_ends: Mapping[str, int]) -> str:
    """The metadata of a commit at source `offset` ("" when there is nothing to carry)."""
    if changelog_ends:
        body = {"o": offset, "t": dict(stream_times), "c": dict(changelog_ends), "h": 1}
        metadata = PREFIX_WITH_ENDS + orjson.dumps(body).decode()
    elif stream_times:
        metadata = PREFIX + orjson.dumps(dict(stream_times)).decode()
    else:
        return ""
    if len(metadata.encode()) > MAX_METADATA_BYTES:
        raise ConfigurationError(
            f"the metadata of stores {sorted(set(stream_times) | set(changelog_ends))} takes {len(metadata.encode())} "
            f"bytes in the offset commit, more than the brokers' default offset.metadata.max.bytes "
            f"({MAX_METADATA_BYTES}): give the stores shorter names, or fewer of them per app"
        )
    return metadata


def decode_commit_metadata(metadata: str | None, offset: int | None, where: str) -> CommitMetadata:
    """What a commit at source `offset` recorded in its `metadata` (nothing when it is not in this
    format). `where` names the topic partition, for the warning a damaged value gets."""
    if not metadata or not metadata.startswith((PREFIX, PREFIX_WITH_ENDS)):
        return CommitMetadata()
    try:
        decoded = orjson.loads(metadata[len(PREFIX) :])
    except orjson.JSONDecodeError:
        decoded = None
    if metadata.startswith(PREFIX):
        if _is_int_map(decoded):
            return CommitMetadata(stream_times=decoded)
    elif isinstance(decoded, dict) and _is_int_map(decoded.get("t")) and _is_int_map(decoded.get("c")):
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


def _is_int_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(number, int) and not isinstance(number, bool)
        for name, number in value.items()
    )
