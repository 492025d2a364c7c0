"""Strict input of an HTTP request: its body, headers and query string.

Everything a client sends is checked before a handler touches the database, and every
refusal is an ``OrbitError`` with a stable code and the field it names. The rules of
the fields themselves (and the strict JSON reader) are ``orbit_node.domain.rules``; this
module applies them to the request at hand.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any

from quart import current_app, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from orbit_protocol.limits import MAX_TASK_WAIT_S

from ..domain.errors import InvalidArgument, PayloadTooLarge, UnsupportedMediaType
from ..domain.ids import is_hex32
from ..domain.rules import IDEMPOTENCY_KEY, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, kind, parse_json
from ..domain.strict_json import show
from ..domain.task_query import STATES
from ..domain.trace_context import TraceContext
from ..domain.trace_context import parse as trace_context_of

# -- the request -------------------------------------------------------------------


def _max_body_bytes() -> int:
    return current_app.config["MAX_CONTENT_LENGTH"]


def check_declared_length() -> None:
    """Refuse a declared Content-Length over the limit before anything is read."""
    limit = _max_body_bytes()
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body: request body exceeds {limit} bytes", field="body")


def has_body() -> bool:
    """The request declares a body (a length above zero, or chunked)."""
    return (request.content_length or 0) > 0 or "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def _require_json_media_type() -> None:
    if request.mimetype != "application/json":
        got = request.headers.get("Content-Type")
        raise UnsupportedMediaType(
            f"Content-Type: expected application/json, got {show(got) if got else 'none'}", field="Content-Type"
        )
    charset = request.mimetype_params.get("charset")
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(f"Content-Type: charset must be utf-8, got {show(charset)}", field="Content-Type")


async def read_body() -> bytes:
    """The raw body, never more than the configured limit (chunked bodies included)."""
    check_declared_length()
    try:
        raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        raise PayloadTooLarge(f"body: request body exceeds {_max_body_bytes()} bytes", field="body") from None
    g.body_read = True
    return raw


def body_was_read() -> bool:
    return getattr(g, "body_read", False)


async def json_object(*, required: bool) -> dict[str, Any]:
    """The body as a JSON object. Without ``required``, an empty body reads as ``{}``."""
    if not has_body():
        if required:
            raise InvalidArgument("body: expected a JSON object, got an empty body", field="body")
        return {}
    _require_json_media_type()
    raw = await read_body()
    if not raw:
        if required:
            raise InvalidArgument("body: expected a JSON object, got an empty body", field="body")
        return {}
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise InvalidArgument(f"body: expected a JSON object, got {kind(value)}", field="body")
    return value


def idempotency_key() -> str:
    values = request.headers.getlist("Idempotency-Key")
    if not values:
        raise InvalidArgument("Idempotency-Key: header is required", field="Idempotency-Key")
    if len(values) > 1:
        raise InvalidArgument("Idempotency-Key: header given more than once", field="Idempotency-Key")
    if not IDEMPOTENCY_KEY.fullmatch(values[0]):
        raise InvalidArgument(
            "Idempotency-Key: must be 1-255 visible ASCII characters (0x21-0x7E)", field="Idempotency-Key"
        )
    return values[0]


def trace_context() -> TraceContext | None:
    """The request's W3C ``traceparent`` (with its ``tracestate``), or None when it is
    absent, malformed or given more than once: a broken tracer never refuses a request
    (``orbit_node.domain.trace_context``)."""
    parents = request.headers.getlist("traceparent")
    if len(parents) != 1:
        return None
    states = request.headers.getlist("tracestate")
    # Several tracestate headers are one list, joined as the W3C says.
    return trace_context_of(parents[0], ",".join(states) if states else None)


def no_idempotency_header() -> None:
    """Routes whose keys are in the body (POST /v1/tasks/batch) refuse the header: it would
    suggest an idempotency the route does not give the request as a whole."""
    if request.headers.get("Idempotency-Key") is not None:
        raise InvalidArgument(
            "Idempotency-Key: not used by this route; give each task its own idempotency_key",
            field="Idempotency-Key",
        )


# -- query strings and cursors -----------------------------------------------------


def query(allowed: Iterable[str]) -> dict[str, str]:
    allowed = set(allowed)
    result: dict[str, str] = {}
    for key, values in request.args.lists():
        if key not in allowed:
            raise InvalidArgument(f"{key}: unknown query parameter", field=key)
        if len(values) > 1:
            raise InvalidArgument(f"{key}: given more than once", field=key)
        result[key] = values[0]
    return result


def query_lists(allowed: Iterable[str], repeatable: Iterable[str]) -> dict[str, list[str]]:
    """The query parameters, each with its values: the ``repeatable`` ones may be given
    several times, the others once; unknown ones are refused."""
    allowed, repeatable = set(allowed), set(repeatable)
    result: dict[str, list[str]] = {}
    for key, values in request.args.lists():
        if key not in allowed:
            raise InvalidArgument(f"{key}: unknown query parameter", field=key)
        if len(values) > 1 and key not in repeatable:
            raise InvalidArgument(f"{key}: given more than once", field=key)
        result[key] = values
    return result


def limit(params: Mapping[str, str]) -> int:
    text = params.get("limit")
    if text is None:
        return LIST_LIMIT_DEFAULT
    if not re.fullmatch(r"[0-9]{1,4}", text) or not 1 <= int(text) <= LIST_LIMIT_MAX:
        raise InvalidArgument(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}, got {show(text)}", field="limit")
    return int(text)


def wait_s(params: Mapping[str, str]) -> float | None:
    """``wait_s`` of GET /v1/tasks/{id}: seconds from 0 to ``MAX_TASK_WAIT_S``, at most
    three decimals (None when absent)."""
    text = params.get("wait_s")
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,2}(\.[0-9]{1,3})?", text) or float(text) > MAX_TASK_WAIT_S:
        raise InvalidArgument(
            f"wait_s: must be a number of seconds from 0 to {MAX_TASK_WAIT_S} (at most 3 decimals), got {show(text)}",
            field="wait_s",
        )
    return float(text)


def state(params: Mapping[str, str]) -> str | None:
    value = params.get("state")
    if value is not None and value not in STATES:
        raise InvalidArgument(f"state: must be one of {', '.join(STATES)}, got {show(value)}", field="state")
    return value


def encode_cursor(kind: str, last_id: str | None) -> str | None:
    """An opaque page token: the kind of listing and the last id it returned."""
    if last_id is None:
        return None
    return base64.urlsafe_b64encode(f"{kind}.{last_id}".encode()).decode().rstrip("=")


def decode_cursor(kind: str, params: Mapping[str, str]) -> str | None:
    text = params.get("cursor")
    if text is None:
        return None
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        decoded = ""
    prefix, _, last_id = decoded.partition(".")
    if prefix != kind or not is_hex32(last_id):
        raise InvalidArgument("cursor: not a cursor returned by this listing", field="cursor")
    return last_id
