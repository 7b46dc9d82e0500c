"""Sensor cursors as JSON objects that survive anything: an unreadable cursor starts afresh.

Owns `load_cursor` (a dict from the stored string, or an empty dict, with a warning, when it is
missing, not JSON, or not an object) and `dump_cursor`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def load_cursor(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.warning("Ignoring an unreadable sensor cursor (%.80r); starting afresh", raw)
        return {}
    return data


def dump_cursor(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
