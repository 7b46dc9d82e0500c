"""What a source offset commit carries besides the offset: the stream time of each store that keeps time.

Owns the format of the commit's metadata string. Kafka Streams keeps a task's partition time in
the metadata of its offset commit; so does this engine, per window or TTL store, so that the
stream time of the last commit is known exactly when the partition is taken up again, even after
compaction removed its committed record from the changelog (a crash between delivering a commit's
changelog and committing the source leaves a newer, uncommitted one). Messages processed again
are judged by it: a stream time advanced by work that was never committed would take them for late.

Format: `"ds1:"` followed by a JSON object, store name to stream time in ms. Metadata in another
form (written by another client, or none) reads as no stream times: each store's own is used.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson

from dagster_stateful.errors import ConfigurationError

log = logging.getLogger(__name__)

PREFIX = "ds1:"
MAX_METADATA_BYTES = 4096
"""The brokers' default `offset.metadata.max.bytes`: a commit with longer metadata is refused."""


def encode_stream_times(stream_times: Mapping[str, int]) -> str:
    """The metadata of a commit whose stores stand at `stream_times` ("" when there is none)."""
    if not stream_times:
        return ""
    metadata = PREFIX + orjson.dumps(dict(stream_times)).decode()
    if len(metadata.encode()) > MAX_METADATA_BYTES:
        raise ConfigurationError(
            f"the stream times of stores {sorted(stream_times)} take {len(metadata.encode())} bytes in the offset "
            f"commit's metadata, more than the brokers' default offset.metadata.max.bytes ({MAX_METADATA_BYTES}): "
            "give the window and TTL stores shorter names, or fewer of them per app"
        )
    return metadata


def decode_stream_times(metadata: str | None, where: str) -> dict[str, int]:
    """The stream times a commit's `metadata` records (none when it is not in this format).
    `where` names the topic partition, for the warning a damaged value gets."""
    if not metadata or not metadata.startswith(PREFIX):
        return {}
    try:
        decoded = orjson.loads(metadata[len(PREFIX) :])
    except orjson.JSONDecodeError:
        decoded = None
    if not isinstance(decoded, dict) or not all(
        isinstance(name, str) and isinstance(value, int) for name, value in decoded.items()
    ):
        log.warning(
            "The committed offset of %s carries metadata that is not a stream-time record (%.80r); the stores' own "
            "stream times are used",
            where,
            metadata,
        )
        return {}
    return decoded
