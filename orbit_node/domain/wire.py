"""How stored values look on the wire (HTTP envelope, Worker protocol, admin output)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, overload

import attrs

from . import strict_json


@overload
def rfc3339(value: datetime) -> str: ...
@overload
def rfc3339(value: datetime | None) -> str | None: ...


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


@attrs.frozen
class Verbatim:
    """A stored JSON text written into a JSON line as it is, byte for byte (``json_line``)."""

    text: str


def verbatim_json(text: str | None) -> Any:
    """A JSON text column for a JSON line: strict JSON on one line as it is stored; strict
    JSON laid out over several lines as its value (one line must hold it); any other text
    (an older row's plain text) as a JSON string."""
    if text is None:
        return None
    try:
        value = strict_json.loads(text)
    except strict_json.NotStrictJson:
        return text
    return value if "\n" in text or "\r" in text else Verbatim(text)


# One line of JSON Lines: compact, UTF-8 as it is; every value is JSON (no NaN).
_LINE_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_line(value: Any) -> str:
    """``value`` (JSON-ready, with ``Verbatim`` texts anywhere in it) as one line of JSON,
    without its line break; object keys keep their order."""
    if isinstance(value, Verbatim):
        return value.text
    if isinstance(value, dict):
        items = (f"{_LINE_JSON.encode(key)}:{json_line(item)}" for key, item in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_line(item) for item in value) + "]"
    return _LINE_JSON.encode(value)
