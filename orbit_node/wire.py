"""How stored values look on the wire (HTTP envelope, Worker protocol, admin output)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any


def rfc3339(value: datetime | None) -> str | None:
    """A database DATETIME (naive, UTC session) as RFC 3339 with microseconds."""
    if value is None:
        return None
    # Aware values of one instant compare (and hash) equal whatever their offset: not cached.
    return _rfc3339(value) if value.tzinfo is None else value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=4096)
def _rfc3339(value: datetime) -> str:
    # Cached: the tasks of one answer share most of their times (a batch's created_at,
    # updated_at and available_at are one database clock reading).
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stored_json(text: str | None) -> Any:
    """A JSON text column (payload, result, error); an older row may hold plain text."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
