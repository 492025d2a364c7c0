"""How stored values look on the wire (HTTP envelope, Worker protocol, admin output)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def rfc3339(value: datetime | None) -> str | None:
    """A database DATETIME (naive, UTC session) as RFC 3339 with microseconds."""
    return None if value is None else value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stored_json(text: str | None) -> Any:
    """A JSON text column (payload, result, error); an older row may hold plain text."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
