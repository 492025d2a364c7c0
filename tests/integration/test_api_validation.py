"""Strict input of POST /v1/tasks over real HTTP: every bad input is a 4xx with a stable
code and the field it names, and nothing is stored (tasks, idempotency records, resource keys)."""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest
import trio

from orbit_node.domain import strict_json

from ..nodeutil import Tenant, assert_error, make_tenant, stored_counts

NOTHING = {"tasks": 0, "idempotency_records": 0, "resource_keys": 0}
QUEUE = "{queue}"
BASE = (
    '{"queue_id":"{queue}","handler":"object.prepare","handler_version":"v1",'
    '"payload_version":"v1","payload":{"object_ref":"objects/example"}'
)


def body_with(extra: str) -> bytes:
    """The valid base body plus ``extra`` members (raw JSON text, so 9.0 stays 9.0)."""
    return (BASE + ("," + extra if extra else "") + "}").encode()


def body_without(name: str) -> bytes:
    document = json.loads(BASE + "}")
    del document[name]
    return json.dumps(document).encode()


# (case id, raw body, field) -> 400 INVALID_ARGUMENT naming field.
FIELD_CASES = [
    # priority: a JSON integer 0..9 and nothing else (P3 section 1).
    ("priority -1", body_with('"priority":-1'), "priority"),
    ("priority 10", body_with('"priority":10'), "priority"),
    ("priority 9.0", body_with('"priority":9.0'), "priority"),
    ("priority 1e0", body_with('"priority":1e0'), "priority"),
    ("priority 0.0", body_with('"priority":0.0'), "priority"),
    ("priority 9.5", body_with('"priority":9.5'), "priority"),
    ('priority "9"', body_with('"priority":"9"'), "priority"),
    ("priority true", body_with('"priority":true'), "priority"),
    ("priority false", body_with('"priority":false'), "priority"),
    ("priority null", body_with('"priority":null'), "priority"),
    ("priority huge", body_with('"priority":99999999999999999999'), "priority"),
    ("priority array", body_with('"priority":[9]'), "priority"),
    ("priority object", body_with('"priority":{"level":9}'), "priority"),
    # unknown and missing fields
    ("unknown field", body_with('"colour":"blue"'), "colour"),
    ("unknown application", body_with('"application_id":"ffffffffffffffffffffffffffffffff"'), "application_id"),
    ("missing queue_id", body_without("queue_id"), "queue_id"),
    ("missing handler", body_without("handler"), "handler"),
    ("missing handler_version", body_without("handler_version"), "handler_version"),
    ("missing payload_version", body_without("payload_version"), "payload_version"),
    ("missing payload", body_without("payload"), "payload"),
    # identifiers and names
    ("queue_id uppercase", BASE.replace("{queue}", "A" * 32).encode() + b"}", "queue_id"),
    ("queue_id short", BASE.replace("{queue}", "abc").encode() + b"}", "queue_id"),
    ("queue_id number", BASE.replace('"{queue}"', "12345").encode() + b"}", "queue_id"),
    ("handler empty", BASE.replace('"object.prepare"', '""').encode() + b"}", "handler"),
    ("handler space", BASE.replace('"object.prepare"', '"object prepare"').encode() + b"}", "handler"),
    ("handler too long", BASE.replace('"object.prepare"', '"' + "h" * 201 + '"').encode() + b"}", "handler"),
    ("handler number", BASE.replace('"object.prepare"', "5").encode() + b"}", "handler"),
    (
        "handler_version empty",
        BASE.replace('"handler_version":"v1"', '"handler_version":""').encode() + b"}",
        "handler_version",
    ),
    (
        "handler_version too long",
        BASE.replace('"handler_version":"v1"', '"handler_version":"' + "v" * 65 + '"').encode() + b"}",
        "handler_version",
    ),
    (
        "payload_version null",
        BASE.replace('"payload_version":"v1"', '"payload_version":null').encode() + b"}",
        "payload_version",
    ),
    # times
    ("available_at date only", body_with('"available_at":"2030-01-01"'), "available_at"),
    ("available_at no offset", body_with('"available_at":"2030-01-01T00:00:00"'), "available_at"),
    ("available_at Feb 30", body_with('"available_at":"2030-02-30T00:00:00Z"'), "available_at"),
    ("available_at hour 24", body_with('"available_at":"2030-01-01T24:00:00Z"'), "available_at"),
    ("available_at offset 24h", body_with('"available_at":"2030-01-01T00:00:00+24:00"'), "available_at"),
    ("available_at before 1970", body_with('"available_at":"1969-12-31T23:59:59Z"'), "available_at"),
    ("available_at past 9999", body_with('"available_at":"9999-12-31T23:00:00-05:00"'), "available_at"),
    ("available_at number", body_with('"available_at":1893456000'), "available_at"),
    ("available_at and delay_s", body_with('"available_at":"2030-01-01T00:00:00Z","delay_s":5'), "delay_s"),
    ("delay_s negative", body_with('"delay_s":-1'), "delay_s"),
    ("delay_s string", body_with('"delay_s":"5"'), "delay_s"),
    ("delay_s bool", body_with('"delay_s":true'), "delay_s"),
    ("delay_s over a year", body_with('"delay_s":31622401'), "delay_s"),
    ("delay_s null", body_with('"delay_s":null'), "delay_s"),
    ("deadline text", body_with('"deadline":"tomorrow"'), "deadline"),
    (
        "deadline before available_at",
        body_with('"available_at":"2030-01-02T00:00:00Z","deadline":"2030-01-01T00:00:00Z"'),
        "deadline",
    ),
    # attempts and backoff
    ("max_attempts 0", body_with('"max_attempts":0'), "max_attempts"),
    ("max_attempts 101", body_with('"max_attempts":101'), "max_attempts"),
    ("max_attempts 3.0", body_with('"max_attempts":3.0'), "max_attempts"),
    ('max_attempts "3"', body_with('"max_attempts":"3"'), "max_attempts"),
    ("backoff number", body_with('"backoff":5'), "backoff"),
    ("backoff unknown member", body_with('"backoff":{"jitter":0.1}'), "backoff.jitter"),
    ("backoff initial 0", body_with('"backoff":{"initial_ms":0}'), "backoff.initial_ms"),
    ("backoff max below initial", body_with('"backoff":{"initial_ms":5000,"max_ms":1000}'), "backoff.max_ms"),
    ("backoff max over a day", body_with('"backoff":{"max_ms":86400001}'), "backoff.max_ms"),
    ("backoff multiplier 0.5", body_with('"backoff":{"multiplier":0.5}'), "backoff.multiplier"),
    ("backoff multiplier bool", body_with('"backoff":{"multiplier":true}'), "backoff.multiplier"),
    # resource key
    ("resource_key empty", body_with('"resource_key":""'), "resource_key"),
    ("resource_key too long", body_with('"resource_key":"' + "r" * 256 + '"'), "resource_key"),
    ("resource_key control char", body_with('"resource_key":"a\\nb"'), "resource_key"),
    ("resource_key number", body_with('"resource_key":7'), "resource_key"),
    ("resource_key null", body_with('"resource_key":null'), "resource_key"),
]

# (case id, raw body) -> 400 INVALID_ARGUMENT naming "body".
BODY_CASES = [
    ("duplicate key", body_with('"priority":1,"priority":2')),
    ("duplicate key nested", body_with('"backoff":{"max_ms":1000,"max_ms":2000}')),
    ("NaN", body_with('"delay_s":NaN')),
    ("Infinity", body_with('"delay_s":Infinity')),
    ("-Infinity in payload", BASE.replace('{"object_ref":"objects/example"}', "-Infinity").encode() + b"}"),
    ("number overflowing a double", BASE.replace('{"object_ref":"objects/example"}', "1e999").encode() + b"}"),
    ("integer too long to parse", BASE.replace('{"object_ref":"objects/example"}', "9" * 5000).encode() + b"}"),
    ("lone surrogate", BASE.replace('"objects/example"', '"\\ud800"').encode() + b"}"),
    ("nested too deep", BASE.replace('{"object_ref":"objects/example"}', "[" * 70 + "]" * 70).encode() + b"}"),
    (
        "nested beyond the recursion limit",
        BASE.replace('{"object_ref":"objects/example"}', "[" * 100_000 + "]" * 100_000).encode() + b"}",
    ),
    ("array body", b"[1,2,3]"),
    ("string body", b'"task"'),
    ("null body", b"null"),
    ("number body", b"42"),
    ("truncated JSON", BASE.encode()),
    ("trailing garbage", body_with("") + b" x"),
    ("single quotes", b"{'queue_id': 'x'}"),
    ("invalid UTF-8", body_with('"resource_key":"ab"').replace(b"ab", b"\xff\xfe")),
    ("UTF-8 BOM", b"\xef\xbb\xbf" + body_with("")),
    ("empty body", b""),
]


def resolve(raw: bytes, tenant: Tenant) -> bytes:
    return raw.replace(QUEUE.encode(), tenant.queue_id.encode())


async def post(running_node, tenant: Tenant, content: bytes, *, headers=None):
    request_headers = {"Idempotency-Key": "key-1", "Content-Type": "application/json"}
    request_headers.update(headers or {})
    async with running_node.client(tenant.token) as client:
        return await client.post("/v1/tasks", content=content, headers=request_headers)


async def test_the_valid_base_body_is_accepted(running_node, db):
    # The table below only means something if its base request is good.
    tenant = await make_tenant(db)
    response = await post(running_node, tenant, resolve(body_with(""), tenant))
    assert response.status_code == 201, response.text
    assert await stored_counts(db) == {"tasks": 1, "idempotency_records": 1, "resource_keys": 0}


@pytest.mark.parametrize("raw, field", [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
async def test_bad_field_is_400_naming_it_and_stores_nothing(running_node, db, raw, field):
    tenant = await make_tenant(db)
    response = await post(running_node, tenant, resolve(raw, tenant))
    assert_error(response, 400, "INVALID_ARGUMENT", field)
    assert await stored_counts(db) == NOTHING


@pytest.mark.parametrize("raw", [c[1] for c in BODY_CASES], ids=[c[0] for c in BODY_CASES])
async def test_bad_body_is_400_naming_the_body_and_stores_nothing(running_node, db, raw):
    tenant = await make_tenant(db)
    response = await post(running_node, tenant, resolve(raw, tenant))
    assert_error(response, 400, "INVALID_ARGUMENT", "body")
    assert await stored_counts(db) == NOTHING


HEADER_CASES = [
    ("no content type", {"Content-Type": None}, 415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type"),
    ("text/plain", {"Content-Type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type"),
    ("form", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type"),
    (
        "latin-1 charset",
        {"Content-Type": "application/json; charset=latin-1"},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        "Content-Type",
    ),
    ("no idempotency key", {"Idempotency-Key": None}, 400, "INVALID_ARGUMENT", "Idempotency-Key"),
    ("empty idempotency key", {"Idempotency-Key": ""}, 400, "INVALID_ARGUMENT", "Idempotency-Key"),
    ("idempotency key 256 chars", {"Idempotency-Key": "k" * 256}, 400, "INVALID_ARGUMENT", "Idempotency-Key"),
    ("idempotency key with space", {"Idempotency-Key": "my key"}, 400, "INVALID_ARGUMENT", "Idempotency-Key"),
    (
        "idempotency key not ASCII",
        {"Idempotency-Key": "cl\xe9".encode("latin-1")},
        400,
        "INVALID_ARGUMENT",
        "Idempotency-Key",
    ),
]


@pytest.mark.parametrize(
    "headers, status, code, field", [c[1:] for c in HEADER_CASES], ids=[c[0] for c in HEADER_CASES]
)
async def test_bad_headers_are_refused_and_store_nothing(running_node, db, headers, status, code, field):
    tenant = await make_tenant(db)
    request_headers = {"Idempotency-Key": "key-1", "Content-Type": "application/json", **headers}
    request_headers = {k: v for k, v in request_headers.items() if v is not None}
    async with running_node.client(tenant.token) as client:
        request = client.build_request(
            "POST", "/v1/tasks", content=resolve(body_with(""), tenant), headers=request_headers
        )
        for name, value in headers.items():
            if value is None:
                request.headers.pop(name, None)
        response = await client.send(request)
    assert_error(response, status, code, field)
    assert await stored_counts(db) == NOTHING


async def test_idempotency_key_given_twice_is_refused(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await client.post(
            "/v1/tasks",
            content=resolve(body_with(""), tenant),
            headers=[("Content-Type", "application/json"), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
        )
    assert_error(response, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    assert await stored_counts(db) == NOTHING


async def test_unknown_or_foreign_queue_is_404_and_stores_nothing(running_node, db):
    tenant = await make_tenant(db, "app-a")
    other = await make_tenant(db, "app-b")
    for queue_id in (other.queue_id, "f" * 32):
        raw = body_with("").replace(QUEUE.encode(), queue_id.encode())
        response = await post(running_node, tenant, raw)
        assert_error(response, 404, "NOT_FOUND", "queue_id")
        # The message never says whose queue it is.
        assert other.application_id not in response.text
    assert await stored_counts(db) == NOTHING


# -- body size: refused before it is buffered -----------------------------------------


async def raw_exchange(base_url: str, head: bytes, body_parts, *, until_response: bool = True) -> bytes:
    """Send ``head`` and then body parts over a plain TCP stream, reading the answer meanwhile.

    Stops sending as soon as the response has arrived (a server that answers early
    must not need the rest of the body); returns the raw response bytes, once all of
    the response is there.
    """
    url = urllib.parse.urlsplit(base_url)
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    received = bytearray()
    answered, complete = trio.Event(), trio.Event()
    async with stream:
        async with trio.open_nursery() as nursery:

            async def reader():
                while True:
                    try:
                        chunk = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        break
                    if not chunk:
                        break
                    received.extend(chunk)
                    if b"\r\n\r\n" in received:
                        answered.set()
                    if response_complete(received):
                        complete.set()
                answered.set()
                complete.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(reader)
            await stream.send_all(head)
            for part in body_parts:
                if answered.is_set():
                    break
                try:
                    await stream.send_all(part)
                except trio.BrokenResourceError:
                    break
            # Never finish the body: the answer must come without it.
            with trio.fail_after(10):
                await complete.wait()
            nursery.cancel_scope.cancel()
    return bytes(received)


def response_complete(raw: bytes) -> bool:
    """``raw`` holds a whole response: its head and the body its framing announces."""
    head, separator, body = bytes(raw).partition(b"\r\n\r\n")
    if not separator:
        return False
    head = head.lower()
    if b"transfer-encoding: chunked" in head:
        return body.endswith(b"0\r\n\r\n")
    length = re.search(rb"\r\ncontent-length: *(\d+)", head)
    return length is not None and len(body) >= int(length.group(1))  # (no length: until the close)


def parse_raw_response(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        size_text, _, rest = body.partition(b"\r\n")
        body = rest[: int(size_text, 16)]
    return status, json.loads(body)


def request_head(tenant: Tenant, host: str, extra: str) -> bytes:
    return (
        "POST /v1/tasks HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        f"Authorization: Bearer {tenant.token}\r\n"
        "Idempotency-Key: big-1\r\n"
        "Content-Type: application/json\r\n"
        f"{extra}\r\n"
    ).encode()


async def test_declared_oversize_body_is_413_without_sending_it(running_node, db, node_config):
    tenant = await make_tenant(db)
    host = urllib.parse.urlsplit(running_node.base_url).netloc
    declared = node_config.max_body_bytes * 10
    raw = await raw_exchange(
        running_node.base_url,
        request_head(tenant, host, f"Content-Length: {declared}\r\n"),
        # Only the first 1000 bytes of the declared body are ever sent.
        [b"{" + b" " * 999],
    )
    status, document = parse_raw_response(raw)
    assert status == 413
    assert document["error"] == {
        "code": "PAYLOAD_TOO_LARGE",
        "message": f"body: request body exceeds {node_config.max_body_bytes} bytes",
        "field": "body",
    }
    assert await stored_counts(db) == NOTHING


async def test_chunked_oversize_body_is_413_once_the_limit_is_passed(running_node, db, node_config):
    tenant = await make_tenant(db)
    host = urllib.parse.urlsplit(running_node.base_url).netloc
    chunk = b" " * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    # Just over the limit, and the terminating chunk is never sent.
    parts = [framed] * (node_config.max_body_bytes // len(chunk) + 2)
    raw = await raw_exchange(running_node.base_url, request_head(tenant, host, "Transfer-Encoding: chunked\r\n"), parts)
    status, document = parse_raw_response(raw)
    assert status == 413
    assert document["error"]["code"] == "PAYLOAD_TOO_LARGE" and document["error"]["field"] == "body"
    assert await stored_counts(db) == NOTHING


async def test_body_at_the_limit_is_read(running_node, db, node_config):
    # Exactly max_body_bytes is allowed: padding whitespace keeps the JSON valid.
    tenant = await make_tenant(db)
    raw = resolve(body_with(""), tenant)
    padded = raw + b" " * (node_config.max_body_bytes - len(raw))
    response = await post(running_node, tenant, padded)
    assert response.status_code == 201, response.text
    too_big = padded + b" "
    response = await post(running_node, tenant, too_big, headers={"Idempotency-Key": "key-2"})
    assert_error(response, 413, "PAYLOAD_TOO_LARGE", "body")
    assert (await stored_counts(db))["tasks"] == 1


# -- framework errors use the envelope too ----------------------------------------------


async def test_unknown_route_and_wrong_method_use_the_envelope(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        missing = await client.get("/v1/nothing-here")
        wrong = await client.delete("/v1/tasks")
    assert_error(missing, 404, "NOT_FOUND", "path")
    assert_error(wrong, 405, "METHOD_NOT_ALLOWED", "method")
    assert set(wrong.headers["Allow"].split(", ")) >= {"GET", "POST"}


LIST_CASES = [
    ("limit 0", "limit=0", "limit"),
    ("limit 501", "limit=501", "limit"),
    ("limit text", "limit=ten", "limit"),
    ("limit negative", "limit=-1", "limit"),
    ("state unknown", "state=done", "state"),
    ("queue_id malformed", "queue_id=xyz", "queue_id"),
    ("cursor garbage", "cursor=not-a-cursor", "cursor"),
    ("unknown parameter", "order=asc", "order"),
    # state, priority and task_ids may be repeated (a list); the others are given once.
    ("repeated parameter", f"queue_id={'a' * 32}&queue_id={'b' * 32}", "queue_id"),
    ("repeated limit", "limit=1&limit=2", "limit"),
]


@pytest.mark.parametrize("query, field", [c[1:] for c in LIST_CASES], ids=[c[0] for c in LIST_CASES])
async def test_bad_list_query_is_400_naming_the_parameter(running_node, db, query, field):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await client.get(f"/v1/tasks?{query}")
    assert_error(response, 400, "INVALID_ARGUMENT", field)


async def test_a_queue_cursor_is_not_a_task_cursor(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        page = (await client.get("/v1/queues?limit=1")).json()
        assert page["next_cursor"]
        response = await client.get(f"/v1/tasks?cursor={page['next_cursor']}")
    assert_error(response, 400, "INVALID_ARGUMENT", "cursor")


async def test_bad_path_ids_are_400(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        for method, path, field in (
            ("GET", "/v1/tasks/NOT-HEX", "task_id"),
            ("POST", "/v1/tasks/123/cancel", "task_id"),
            ("GET", "/v1/queues/" + "G" * 32, "queue_id"),
            ("POST", "/v1/queues/zz/pause", "queue_id"),
        ):
            assert_error(await client.request(method, path), 400, "INVALID_ARGUMENT", field)


async def test_action_routes_refuse_body_fields(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await client.post(f"/v1/queues/{tenant.queue_id}/pause", json={"paused": True})
        assert_error(response, 400, "INVALID_ARGUMENT", "paused")
        response = await client.post(
            f"/v1/queues/{tenant.queue_id}/pause", content=b"x", headers={"Content-Type": "text/plain"}
        )
        assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type")
        # An empty JSON object is the same as no body.
        response = await client.post(f"/v1/queues/{tenant.queue_id}/pause", json={})
        assert response.status_code == 200 and response.json()["data"]["paused"] is True


async def test_a_refused_body_does_not_leave_a_hung_connection(running_node, db, node_config):
    # A response given before the body is read closes the connection; the client's next
    # request opens a new one instead of waiting forever on the old one.
    tenant = await make_tenant(db)
    big = b" " * (node_config.max_body_bytes * 4)
    async with running_node.client(tenant.token) as client:
        with trio.fail_after(20):
            for _ in range(3):
                refused = await client.post(
                    "/v1/tasks", content=big, headers={"Idempotency-Key": "k", "Content-Type": "application/json"}
                )
                assert_error(refused, 413, "PAYLOAD_TOO_LARGE", "body")
                assert refused.headers["Connection"] == "close"
                assert (await client.get("/healthz")).status_code == 200
            unauthenticated = await client.post(
                "/v1/tasks",
                content=big[:500_000],
                headers={"Authorization": "Bearer nope", "Content-Type": "application/json"},
            )
            assert_error(unauthenticated, 401, "UNAUTHENTICATED", "authorization")
            assert (await client.get("/healthz")).status_code == 200
    assert await stored_counts(db) == NOTHING


@pytest.mark.parametrize("escape", ["", "\\u00e9"])
@pytest.mark.parametrize("shape", ["list", "object", "mixed"])
def test_nesting_is_refused_beyond_the_limit_exactly(shape, escape):
    """64 levels of containers are read, 65 refused, with or without a \\u escape (a
    text with one is walked for lone surrogates too)."""

    def nested(levels: int) -> str:
        text = f'"{escape}x"'
        for level in range(levels):
            kind = shape if shape != "mixed" else ("list", "object")[level % 2]
            text = f"[{text}, 1]" if kind == "list" else f'{{"k": {text}, "n": 2}}'
        return text

    assert strict_json.loads(nested(strict_json.MAX_JSON_DEPTH)) is not None
    with pytest.raises(strict_json.NotStrictJson, match="nested deeper than 64"):
        strict_json.loads(nested(strict_json.MAX_JSON_DEPTH + 1))


@pytest.mark.parametrize(
    "text", ['{"a": 1, "b": 2, "a": 3}', '[{"x": {"y": 1, "y": 1}}]', '{"a": {"b": 1}, "a": {"b": 1}}']
)
def test_a_duplicate_key_is_named_at_any_depth(text):
    with pytest.raises(strict_json.NotStrictJson, match="duplicate object key"):
        strict_json.loads(text)
