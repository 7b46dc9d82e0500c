"""The changelog record format: what the commit path writes and every restore reads.

A changelog record's key and value are the store's key and value (no value: the key was deleted).
Its headers say which message's processing wrote it, in one of three ways:
- one header, `source_offset`: the source offset of that message, as 8 big-endian signed bytes.
  Restores compare it with the group's committed offset to tell records of committed messages from
  the rest (`uncommitted.UncommittedFilter`).
- no header at all (a *bare* record): written at-least-once by a commit that records where its
  changelog partition ends (`processing.commit_metadata`), which saves the header's cost on every
  record. Below the end the group's last commit recorded, a bare record is of a committed message;
  at or past it, when that commit says so (`"h"`), or when the group never committed, it is of a
  commit whose offset was never committed. Elsewhere (an older engine's commits) it counts as
  committed.
- the `state_write` header: state written from outside the workers (a bootstrap, a migration),
  committed state wherever it lies.
"""

from __future__ import annotations

from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.recovery.uncommitted import OFFSET_BYTES, decode_processed_offset, encode_processed_offset

SOURCE_OFFSET_HEADER = "source_offset"
STATE_WRITE_HEADER = "state_write"
STATE_WRITE_HEADERS: Headers = [(STATE_WRITE_HEADER, b"")]
"""The headers of a record of state written from outside the workers: committed wherever it lies."""


def source_offset_header(offset: int) -> Headers:
    """The headers of a changelog record written by processing the message at source `offset`."""
    return [(SOURCE_OFFSET_HEADER, offset.to_bytes(OFFSET_BYTES, "big", signed=True))]  # once per record


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
