"""Security under hostile input (real node, real MariaDB, real sockets).

Covered elsewhere and linked from docs/guarantees.md: oversized WebSocket messages close
with 1009 (test_workers_e2e.py), HTTP bodies over the limit are 413 before they are read
(test_api_validation.py), scope checks on every route (test_api_auth.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from harness.nodeproc import NodeProcess
from harness.proxy import Direction, open_fault_proxy
from orbit_node.services import default_services
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..checks import rows
from ..helpers import BIN
from ..nodeutil import make_tenant, make_token, run_node
from ..wsclient import CAP, heartbeat_roundtrip, raw_worker, ws_url

TASK = {"handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {"x": 1}}


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


async def handshake_status(url: str, token: str | None, query: str = "") -> tuple[int, dict]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(url + query, extra_headers=headers):
            pass
    return info.value.status_code, json.loads(info.value.body)


async def test_worker_handshake_refuses_missing_unknown_revoked_and_query_string_credentials(full_node, db):
    tenant = await make_tenant(db, "ws-auth")
    tenancy = TenancyStore(db)
    revoked_id, revoked = await tenancy.create_credential(tenant.namespace_id, "old", {"workers:connect": "*"})
    await tenancy.revoke_credential(revoked_id)
    url = ws_url(full_node.base_url)
    hub = full_node.node.state.services.hub
    # A well-formed token with a wrong secret: the id exists, the secret does not match.
    forged = tenant.token[:-8] + ("0" * 8 if not tenant.token.endswith("0" * 8) else "1" * 8)
    cases = [
        (None, "", 401, "UNAUTHENTICATED"),
        ("orb_" + "0" * 96, "", 401, "UNAUTHENTICATED"),
        (forged, "", 401, "UNAUTHENTICATED"),
        (revoked, "", 401, "UNAUTHENTICATED"),
        (None, f"?access_token={tenant.token}", 400, "INVALID_ARGUMENT"),
        # Even with a valid header, a credential in the query string is refused (it leaks into logs and proxies).
        (tenant.token, f"?x={tenant.token}", 400, "INVALID_ARGUMENT"),
    ]
    with trio.fail_after(20):
        for token, query, status, code in cases:
            got_status, body = await handshake_status(url, token, query)
            assert (got_status, body["error"]["code"]) == (status, code), (token, query, body)
            assert tenant.token not in json.dumps(body)
    assert hub.admitted == 0 and not hub.connections
    assert await rows(db, "SELECT connection_id FROM worker_connections") == []


def _same_but_ids(a: httpx.Response, b: httpx.Response, *ids: str) -> None:
    """Two refusals are indistinguishable once the ids they echo are blanked out."""
    assert a.status_code == b.status_code
    ea, eb = a.json()["error"], b.json()["error"]
    for value in ids:
        ea["message"], eb["message"] = ea["message"].replace(value, "<id>"), eb["message"].replace(value, "<id>")
    assert ea == eb, (ea, eb)
    assert set(a.headers) - {"x-request-id", "date"} == set(b.headers) - {"x-request-id", "date"}


# Ids of the right form that name nothing.
UNKNOWN_TASK, UNKNOWN_QUEUE = "cd" * 16, "ab" * 16


async def foreign_ids_look_missing(http: httpx.AsyncClient, task_id: str, queue_id: str) -> None:
    """Another tenant's task and queue: 404 on every read and cancel, exactly as for ids that
    exist nowhere."""
    for method, path in (("GET", "/v1/tasks/{}"), ("POST", "/v1/tasks/{}/cancel"), ("GET", "/v1/tasks/{}/explain")):
        foreign = await http.request(method, path.format(task_id))
        missing = await http.request(method, path.format(UNKNOWN_TASK))
        assert foreign.status_code == 404, (path, foreign.text)
        _same_but_ids(foreign, missing, task_id, UNKNOWN_TASK)
    for path in (f"/v1/queues/{queue_id}", f"/v1/tasks?queue_id={queue_id}"):
        foreign = await http.get(path)
        missing = await http.get(path.replace(queue_id, UNKNOWN_QUEUE))
        assert foreign.status_code == 404, (path, foreign.text)
        _same_but_ids(foreign, missing, queue_id, UNKNOWN_QUEUE)


async def test_another_tenant_cannot_submit_read_cancel_or_consume_and_learns_nothing(full_node, db):
    a = await make_tenant(db, "tenant-a")
    b = await make_tenant(db, "tenant-b")
    task_id = await seed.insert_task(db, seed.Tenant(a.application_id, a.namespace_id, a.queue_id))
    unknown_queue = UNKNOWN_QUEUE
    async with full_node.client(b.token) as http:
        foreign = await http.post("/v1/tasks", json={**TASK, "queue_id": a.queue_id}, headers={"Idempotency-Key": "x1"})
        missing = await http.post(
            "/v1/tasks", json={**TASK, "queue_id": unknown_queue}, headers={"Idempotency-Key": "x2"}
        )
        assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "NOT_FOUND"
        _same_but_ids(foreign, missing, a.queue_id, unknown_queue)
        await foreign_ids_look_missing(http, task_id, a.queue_id)
        listing = await http.get("/v1/tasks")
        assert listing.status_code == 200 and listing.json()["data"] == []
    # Consume: a Worker of B naming A's queue is refused exactly like one naming no queue at all.
    refusals = []
    with trio.fail_after(20):
        for queue_id in (a.queue_id, unknown_queue):
            async with raw_worker(full_node.base_url, b.token) as w:
                await w.send({"type": "hello", "queues": [queue_id], "capabilities": [CAP], "capacity": 1})
                error = await w.recv_type("error")
                with pytest.raises(ConnectionClosed) as closed:
                    await w.recv()
                refusals.append(
                    ({**error, "message": error["message"].replace(queue_id, "<id>")}, closed.value.reason.code)
                )
    assert refusals[0] == refusals[1] and refusals[0][0]["code"] == "NOT_FOUND" and refusals[0][1] == 1008
    # Nothing of A changed, nothing was created for B.
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["cancel_requested"], row["attempts"]) == ("queued", 0, 0)
    assert [r["task_id"] for r in await rows(db, "SELECT task_id FROM tasks")] == [task_id]


async def test_tokens_never_appear_in_the_logs(dsn, db, tmp_path):
    """A debug-level node process sees valid, unknown, revoked and misplaced credentials on
    every entrance; its whole log contains none of them (nor their secret halves)."""
    tenant = await make_tenant(db, "logs")
    tenancy = TenancyStore(db)
    revoked_id, revoked = await tenancy.create_credential(tenant.namespace_id, "old", {"tasks:read": "*"})
    await tenancy.revoke_credential(revoked_id)
    narrow = await make_token(db, tenant, {"tasks:read": "*"})
    unknown = "orb_" + "e" * 32 + "f" * 64
    secrets_ = [tenant.token, revoked, narrow, unknown]
    node = NodeProcess(dsn, tmp_path / "node.log", env={"ORBIT_LOG_LEVEL": "debug", "ORBIT_LOG_FORMAT": "json"})
    await node.start()
    try:
        with trio.fail_after(30):
            async with httpx.AsyncClient(base_url=node.base_url) as http:
                for token in secrets_:
                    auth = {"Authorization": f"Bearer {token}"}
                    await http.post(
                        "/v1/tasks",
                        json={**TASK, "queue_id": tenant.queue_id},
                        headers={**auth, "Idempotency-Key": "k-" + token[-6:]},
                    )
                    await http.get("/v1/tasks", headers=auth)
                    await http.get(f"/v1/tasks?token={token}", headers=auth)
                    await http.post("/v1/queues", json={"name": token[:100]}, headers=auth)
                    await http.get("/v1/tasks", headers={"Authorization": f"Basic {token}"})
                    await http.post(
                        "/v1/tasks",
                        content=b"{" + token.encode(),
                        headers={**auth, "Content-Type": "application/json", "Idempotency-Key": "bad"},
                    )
                    for query in ("", f"?token={token}"):
                        try:
                            async with open_websocket_url(
                                ws_url(node.base_url) + query,
                                extra_headers=[(b"authorization", auth["Authorization"].encode())],
                            ) as ws:
                                await ws.send_message(
                                    json.dumps(
                                        {
                                            "type": "hello",
                                            "queues": [tenant.queue_id],
                                            "capabilities": [CAP],
                                            "capacity": 1,
                                            "token": token,
                                        }
                                    )
                                )
                                await ws.get_message()
                                await ws.send_message("{" + token)
                                await ws.get_message()
                        except (ConnectionRejected, ConnectionClosed):
                            pass
        assert await node.terminate() == 0
    finally:
        await node.aclose()
    log = node.log_text()
    assert len(log.splitlines()) > 10  # debug logging did run
    for token in secrets_:
        assert token not in log
        assert token[-64:] not in log  # the secret half on its own
        assert token[4:36] not in log or token is unknown  # ids of real credentials stay out too


async def test_idle_and_half_open_connections_are_closed_while_healthy_clients_keep_working(node_config, db):
    """Connections that never send a request, stop half-way through one, never say hello,
    half-close (FIN) without a close frame, or vanish from the network after hello, are all
    closed by the node; a healthy Worker and a healthy API client are served the whole time."""
    config = attrs.evolve(node_config, heartbeat_timeout_s=1.0, body_timeout_s=2.0)
    tenant = await make_tenant(db, "idle", queues=("work", "elsewhere"))
    headers = [(b"authorization", f"Bearer {tenant.token}".encode())]
    expected = {
        "silent": 20,
        "partial request": 20,
        "partial body": 20,
        "partial body, authenticated": 20,
        "websocket without hello": 10,
        "half-open websocket": 5,
    }
    async with run_node(config, services=default_services()) as node:
        host, port = "127.0.0.1", int(node.base_url.rsplit(":", 1)[1])
        hub = node.node.state.services.hub
        closed_by_node: list[str] = []

        async def idle_tcp(kind: str, first_bytes: bytes) -> None:
            stream = await trio.open_tcp_stream(host, port)
            if first_bytes:
                await stream.send_all(first_bytes)
            try:
                while await stream.receive_some():  # an error answer may come before the close
                    pass
            except trio.BrokenResourceError:
                pass
            closed_by_node.append(kind)

        async def idle_websocket(kind: str, url: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with open_websocket_url(url, extra_headers=headers) as ws:
                task_status.started()
                with pytest.raises(ConnectionClosed):
                    while True:
                        message = json.loads(await ws.get_message())
                        assert message["type"] == "error" and message["code"] == "HEARTBEAT_TIMEOUT"
            closed_by_node.append(kind)

        async def vanished_worker(base_url: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with raw_worker(base_url, tenant.token) as w:
                await w.hello([tenant.queues["elsewhere"]])  # (the healthy Worker's tasks stay its own)
                task_status.started()
                await trio.sleep_forever()

        with trio.move_on_after(30) as too_slow:
            async with (
                open_fault_proxy(host, port) as proxy,
                open_fault_proxy(host, port) as lost,
                trio.open_nursery() as vanished,
                trio.open_nursery() as nursery,
            ):
                for _ in range(20):
                    nursery.start_soon(idle_tcp, "silent", b"")
                    nursery.start_soon(idle_tcp, "partial request", b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Le")
                    nursery.start_soon(
                        idle_tcp,
                        "partial body",
                        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n"
                        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a"',
                    )
                    # Authenticated: the app waits for the rest of the body (body_timeout_s, then 408).
                    nursery.start_soon(
                        idle_tcp,
                        "partial body, authenticated",
                        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Bearer " + tenant.token.encode() + b"\r\nIdempotency-Key: slow\r\n"
                        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a"',
                    )
                for _ in range(10):
                    nursery.start_soon(idle_websocket, "websocket without hello", ws_url(node.base_url))
                for _ in range(5):
                    await nursery.start(idle_websocket, "half-open websocket", ws_url(f"http://127.0.0.1:{proxy.port}"))
                # The half-open Workers' side of TCP is gone (FIN), with no close frame.
                await proxy.half_close(Direction.UP)
                # Workers that said hello and then vanished from the network: nothing of theirs
                # arrives, nothing reaches them, no FIN or RST ever comes (only the node can end these).
                for _ in range(5):
                    await vanished.start(vanished_worker, f"http://127.0.0.1:{lost.port}")
                lost.blackhole()
                # Healthy traffic while all of that sits there, until every bad connection is gone.
                async with raw_worker(node.base_url, tenant.token) as healthy, node.client(tenant.token) as http:
                    await healthy.hello([tenant.queue_id])
                    n = 0
                    while len(closed_by_node) < sum(expected.values()) or n < 5:
                        response = await http.post(
                            "/v1/tasks",
                            json={**TASK, "queue_id": tenant.queue_id},
                            headers={"Idempotency-Key": f"healthy-{n}"},
                        )
                        assert response.status_code == 201
                        dispatch = (await healthy.recv_type("dispatch"))["tasks"][0]
                        ref = {"task_id": dispatch["task_id"], "token": dispatch["token"]}
                        assert (await healthy.request("start", [ref], f"s{n}"))["results"][0]["ok"]
                        ack = await healthy.request("finish", [{**ref, "outcome": "succeeded", "result": n}], f"f{n}")
                        assert ack["results"][0]["state"] == "succeeded"
                        await heartbeat_roundtrip(healthy)
                        n += 1
                        await trio.sleep(0.2)  # healthy clients' pace while the node's real-time timeouts run
                    while hub.admitted > 1:  # (bounded by too_slow)
                        await heartbeat_roundtrip(healthy)
                        await trio.sleep(0.2)  # a healthy Worker's heartbeat pace, well inside its 1 s timeout
                    assert len(hub.connections) == 1  # only the healthy Worker is left
                    await heartbeat_roundtrip(healthy)
                vanished.cancel_scope.cancel()
        assert not too_slow.cancelled_caught, [(kind, closed_by_node.count(kind)) for kind in expected]
    assert {kind: closed_by_node.count(kind) for kind in expected} == expected
    assert set(await seed.count_states(db)) == {"succeeded"}


# Its own bound on the schemathesis run (180 s) is the one meant to fire.
@pytest.mark.time_cap(240)
async def test_schemathesis_finds_no_server_error(running_node, db, tmp_path):
    """schemathesis generates requests for every operation of schema/openapi.yaml (examples,
    coverage of boundaries, fuzzing and link-following sequences) against a real node over
    HTTP, with a valid credential; no answer may be a 5xx. A fixed seed keeps the run the same
    from one test run to the next."""
    tenant = await make_tenant(db, "fuzz")
    schema = Path(__file__).resolve().parents[2] / "schema" / "openapi.yaml"
    with trio.fail_after(180):
        result = await trio.run_process(
            [
                str(BIN / "schemathesis"),
                "run",
                str(schema),
                "--url",
                running_node.base_url,
                "-H",
                f"Authorization: Bearer {tenant.token}",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "15",
                "--seed",
                "1",
                "--workers",
                "1",
                "--report-dir",
                str(tmp_path),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=str(tmp_path),
        )
    output = result.stdout.decode(errors="replace")
    assert result.returncode == 0, output[-4000:] + result.stderr.decode(errors="replace")[-2000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated and int(generated.group(1)) == int(generated.group(2)) > 500, output[-2000:]
