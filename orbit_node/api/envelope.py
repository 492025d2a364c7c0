"""The one response envelope of the HTTP API.

Success: ``{"data": <value>, "request_id": "..."}`` (lists add ``"next_cursor"``).
Error:   ``{"error": {"code": "...", "message": "...", "field": "..." | null}, "request_id": "..."}``.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
from typing import Any

from quart import Response, g

from ..domain.errors import DatabaseError, OrbitError, ResourceExhausted, SchemaNotReady, Unavailable

log = logging.getLogger("orbit.http")

# Every 503 carries ``Retry-After``: a full node, a node shutting down and a database
# outage are all worth another try (through the balancer, normally on another node).
RETRY_AFTER_S = 1
# What a caller is told when the database cannot serve its request; the cause (host,
# port, errno, the server's own words) goes to the node's log only.
UNAVAILABLE_MESSAGE = "the service is temporarily unavailable; retry later"
SCHEMA_NOT_READY_MESSAGE = "the service's database is not at the schema version this node needs; retry later"


# Request ids only need to be unique, not unguessable: drawn from a generator seeded
# once from the OS, so a request costs no system call for its id.
_request_ids = random.Random(secrets.randbits(128))


def new_request_id() -> str:
    return f"req_{_request_ids.getrandbits(96):024x}"


def current_request_id() -> str:
    request_id = getattr(g, "request_id", None)
    if request_id is None:
        request_id = g.request_id = new_request_id()
    return request_id


# One encoder for every answer (json.dumps with options builds one per call).
_BODY_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def json_response(body: dict[str, Any], status: int) -> Response:
    response = Response(_BODY_JSON.encode(body), status=status, content_type="application/json")
    response.headers["X-Request-Id"] = body.get("request_id", "")
    return response


def ok(data: Any, status: int = 200, **extra: Any) -> Response:
    return json_response({"data": data, **extra, "request_id": current_request_id()}, status)


def error_body(code: str, message: str, field: str | None, request_id: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}, "request_id": request_id}


def error(exc: OrbitError, **members: Any) -> Response:
    """The error envelope of ``exc``; ``members`` are added to its ``error`` object."""
    body = error_body(exc.code, exc.message, exc.field, current_request_id())
    body["error"].update(members)
    response = json_response(body, exc.http_status)
    if exc.http_status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="orbit"'
    elif exc.http_status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    elif isinstance(exc, ResourceExhausted) and exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


def public(exc: OrbitError) -> OrbitError:
    """``exc`` as a caller sees it: a database failure says only that the service is
    unavailable (with its stable code); what the server said stays in the log."""
    if isinstance(exc, SchemaNotReady):
        return SchemaNotReady(SCHEMA_NOT_READY_MESSAGE)
    if isinstance(exc, Unavailable) and exc.cause is not None:
        return Unavailable(UNAVAILABLE_MESSAGE)
    if isinstance(exc, DatabaseError):
        return OrbitError("internal error")
    return exc


def is_refusal(exc: OrbitError) -> bool:
    """The node's own decision not to serve (shutting down, full): nothing to log."""
    return isinstance(exc, (Unavailable, ResourceExhausted)) and getattr(exc, "cause", None) is None


def failure(exc: OrbitError) -> Response:
    """The answer to a request that failed with ``exc``; a server-side failure is logged
    with its cause, the answer carries only ``public(exc)``."""
    if exc.http_status >= 500 and not is_refusal(exc):
        extra: dict[str, Any] = {"request_id": current_request_id(), "code": exc.code}
        cause = getattr(exc, "cause", None)
        if cause is not None:
            extra["cause"] = cause
        log.error("request failed: %s", exc.message, extra=extra)
    return error(public(exc))
