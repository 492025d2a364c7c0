"""The one response envelope of the HTTP API.

Success: ``{"data": <value>, "request_id": "..."}`` (lists add ``"next_cursor"``).
Error:   ``{"error": {"code": "...", "message": "...", "field": "..." | null}, "request_id": "..."}``.
"""

from __future__ import annotations

import json
import random
import secrets
from typing import Any

from quart import Response, g

from ..errors import OrbitError
from ..wire import rfc3339

timestamp = rfc3339


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


def json_response(body: dict[str, Any], status: int) -> Response:
    response = Response(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False), status=status, content_type="application/json"
    )
    response.headers["X-Request-Id"] = body.get("request_id", "")
    return response


def ok(data: Any, status: int = 200, **extra: Any) -> Response:
    return json_response({"data": data, **extra, "request_id": current_request_id()}, status)


def error_body(code: str, message: str, field: str | None, request_id: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}, "request_id": request_id}


def error(exc: OrbitError) -> Response:
    response = json_response(error_body(exc.code, exc.message, exc.field, current_request_id()), exc.http_status)
    if exc.http_status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="orbit"'
    return response
