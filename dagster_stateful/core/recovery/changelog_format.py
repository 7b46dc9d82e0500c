"""The changelog record format: what the commit path writes and every restore reads.

A changelog record's key and value are the store's key and value (no value: the key was deleted).
Its headers say which message's processing wrote it, in one of four ways:
- one header, `source_offset`: the source offset of that message, as 8 big-endian signed bytes.
  Restores compare it with the group's committed offset to tell records of committed messages from
  the rest (`uncommitted.UncommittedFilter`). Exactly-once commits write these.
- a *block*: an at-least-once commit writes each store partition's records as one block, whose
  first record carries two headers and the others none, which saves the header's cost on every
  record. `source_offset` holds the first source offset the commit covers (the partition's
  committed offset when the commit began), `block` where the commit ends (its offset to commit) and
  how many changelog records, from this one on, the block holds. Every record of the block counts
  as written by a message at that first offset: uncommitted while the group's committed offset has
  not passed it, exactly as a record with the header would be. A crashed commit's block thus stays
  uncommitted whatever happens to the group's commit metadata (an offset reset, expiry, a tool);
  the worker that next takes the partition skips it and rewrites, in its first commit, the
  committed value of every key it skipped there (`ChangelogRestore.compensation`), so that once
  the group's offset passes the block's first offset, what follows the block overrides it.
  An older release reads the block's first record by its `source_offset` header, which is
  conservative, and the others as it reads records without headers.
- no header at all, outside any block (a *bare* record of the release that wrote them before
  blocks): below the end the group's last commit recorded, of a committed message; at or past it,
  when that commit says so (`"h"`), or when the group never committed, of a commit whose offset was
  never committed; elsewhere committed.
- the `state_write` header: state written from outside the workers (a bootstrap, a migration),
  committed state wherever it lies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.recovery.uncommitted import OFFSET_BYTES, decode_processed_offset, encode_processed_offset

SOURCE_OFFSET_HEADER = "source_offset"
BLOCK_HEADER = "block"
_BLOCK = struct.Struct(">qI")
"""A block header's value: the commit's offset to commit (8 bytes), its record count (4 bytes)."""
STATE_WRITE_HEADER = "state_write"
STATE_WRITE_HEADERS: Headers = [(STATE_WRITE_HEADER, b"")]
"""The headers of a record of state written from outside the workers: committed wherever it lies."""


def source_offset_header(offset: int) -> Headers:
    """The headers of a changelog record written by processing the message at source `offset`."""
    return [(SOURCE_OFFSET_HEADER, offset.to_bytes(OFFSET_BYTES, "big", signed=True))]  # once per record


def block_headers(first_offset: int, offset_to_commit: int, records: int) -> Headers:
    """The headers of a block's first record: a commit covering source offsets from `first_offset`
    up to `offset_to_commit` wrote `records` changelog records, this one first."""
    return [
        (SOURCE_OFFSET_HEADER, encode_processed_offset(first_offset)),
        (BLOCK_HEADER, _BLOCK.pack(offset_to_commit, records)),
    ]


@dataclass(frozen=True)
class Block:
    """What a block's first record says: the records from it up to changelog offset `end` were
    written by a commit covering source offsets [`first_offset`, `offset_to_commit`)."""

    end: int
    first_offset: bytes
    """8 big-endian bytes, compared as `UncommittedFilter.committed_bytes` is."""
    last_processed: bytes
    """The highest source offset the block's records may have been written by, as 8 bytes."""


def read_block(headers: object, at: int) -> Block | None:
    """The block a record at changelog offset `at` starts, from its headers (None: it starts none)."""
    if not isinstance(headers, list) or len(headers) != 2:
        return None
    (first_name, first), (name, value) = headers
    if first_name != SOURCE_OFFSET_HEADER or name != BLOCK_HEADER:
        return None
    if not isinstance(first, bytes) or len(first) != OFFSET_BYTES:
        return None
    if not isinstance(value, bytes) or len(value) != _BLOCK.size:
        return None
    offset_to_commit, records = _BLOCK.unpack(value)
    return Block(at + records, first, encode_processed_offset(max(offset_to_commit - 1, 0)))


def processed_offset(headers: Headers | None) -> int | None:
    """The source offset a record's headers name (None: the record has no such header)."""
    for name, value in headers or ():
        if name == SOURCE_OFFSET_HEADER and isinstance(value, bytes):
            return decode_processed_offset(value)
    return None


def processed_bytes(headers: object) -> bytes | None:
    """The processed-offset header as 8 big-endian bytes (None: the record has none).

    Runs once per changelog record: the common case (the one header the commit path writes) is
    checked first."""
    if not isinstance(headers, list) or not headers:
        return None
    name, value = headers[0]
    if name == SOURCE_OFFSET_HEADER and len(headers) == 1 and isinstance(value, bytes):
        return value if len(value) == OFFSET_BYTES else None
    offset = processed_offset(headers)
    return None if offset is None else encode_processed_offset(offset)


def bare_uncommitted_from(committed_source_offset: int | None, committed_end: int | None, flagged: bool) -> int | None:
    """Where records without headers start counting as uncommitted: everywhere when the group never
    committed (processing starts over), past the committed end when the last commit says so."""
    if committed_source_offset is None:
        return 0
    return committed_end if flagged else None
