"""End to end over real WebSockets and MariaDB: the node's Worker side and the SDK Worker."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from orbit_node.services import default_services
from orbit_sdk.client import OrbitClient
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from ..nodeutil import make_tenant, run_node
from ..protocol_schema import validate_message

CAP = {"handler": "object.prepare", "handler_version": "v1", "payload_version": "v1"}


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/workers/connect"


async def submit(client: OrbitClient, key: str, queue_id: str, priority: int, payload=None, **extra):
    result = await client.submit_task(
        key,
        SubmitTaskRequest(
            queue_id=queue_id,
            handler="object.prepare",
            handler_version="v1",
            payload_version="v1",
            payload=payload if payload is not None else {"p": priority},
            priority=priority,
            **extra,
        ),
    )
    return result.task


async def test_capacity_one_worker_runs_tasks_in_priority_order(full_node, db):
    tenant = await make_tenant(db, "prio")
    executed = []
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        big = 123456789012345678901234567890123
        ids = [(await submit(client, f"k{p}", tenant.queue_id, p, {"p": p, "big": big})).task_id for p in (0, 9, 4)]
        worker = Worker(url=full_node.base_url, token=tenant.token, queues=[tenant.queue_id], capacity=1)

        @worker.handler("object.prepare", "v1", "v1")
        async def prepare(task: WorkerTask):
            executed.append(task.priority)
            assert task.payload["big"] == big
            return task.payload

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await worker.wait_completed(3)
                await worker.drain()
        assert executed == [9, 4, 0]
        assert worker.drained
        for task_id in ids:
            task = await client.get_task(task_id)
            assert task.state == "succeeded" and task.attempts == 1
        rows = await db.run(lambda tx: tx.fetchall_raw("SELECT result FROM tasks WHERE priority = 9"))
        assert str(big) in rows[0]["result"]


async def test_raw_protocol_dispatch_start_finish_and_schema(full_node, db):
    tenant = await make_tenant(db, "raw")
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        t0 = await submit(client, "a", tenant.queue_id, 0)
        t9 = await submit(client, "b", tenant.queue_id, 9)
    headers = [(b"authorization", f"Bearer {tenant.token}".encode())]
    received = []

    async def recv(ws):
        message = json.loads(await ws.get_message())
        validate_message(message, direction="node")
        received.append(message)
        return message

    with trio.fail_after(15):
        async with open_websocket_url(ws_url(full_node.base_url), extra_headers=headers) as ws:
            await ws.send_message(
                json.dumps({"type": "hello", "queues": [tenant.queue_id], "capabilities": [CAP], "capacity": 2})
            )
            assert (await recv(ws))["type"] == "welcome"
            await ws.send_message(json.dumps({"type": "heartbeat"}))
            got = {}
            while len(got) < 2:
                message = await recv(ws)
                if message["type"] == "dispatch":
                    for task in message["tasks"]:
                        got[task["task_id"]] = task
            assert "priority" not in got[t0.task_id] and got[t9.task_id]["priority"] == 9
            refs = [{"task_id": t["task_id"], "token": t["token"]} for t in got.values()]
            await ws.send_message(json.dumps({"type": "start", "id": "s1", "tasks": refs}))
            ack = await recv(ws)
            while ack["type"] != "ack":
                ack = await recv(ws)
            assert ack["id"] == "s1" and all(r["ok"] and r["state"] == "running" for r in ack["results"])
            finish = [{**ref, "outcome": "succeeded", "result": {"ok": True}} for ref in refs]
            await ws.send_message(json.dumps({"type": "finish", "id": "f1", "tasks": finish}))
            ack = await recv(ws)
            while ack["type"] != "ack":
                ack = await recv(ws)
            assert ack["of"] == "finish" and all(r["ok"] and r["state"] == "succeeded" for r in ack["results"])
            # The same finish repeated: answered with the recorded outcome, nothing written.
            await ws.send_message(json.dumps({"type": "finish", "id": "f2", "tasks": finish[:1]}))
            ack = await recv(ws)
            while ack["type"] != "ack":
                ack = await recv(ws)
            assert ack["results"][0] == {"task_id": finish[0]["task_id"], "ok": True, "state": "succeeded"}
    assert any(m["type"] == "heartbeat" for m in received)


async def test_handshake_refusals(full_node, db):
    tenant = await make_tenant(db, "hs")
    url = ws_url(full_node.base_url)
    cases = [
        (None, "", 401, "UNAUTHENTICATED"),
        ("orb_" + "0" * 96, "", 401, "UNAUTHENTICATED"),
        (None, f"?token={tenant.token}", 400, "INVALID_ARGUMENT"),
    ]
    from ..nodeutil import make_token

    no_connect = await make_token(db, tenant, {"tasks:read": "*"})
    cases.append((no_connect, "", 403, "PERMISSION_DENIED"))
    for token, query, status, code in cases:
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(url + query, extra_headers=headers):
                pass
        assert info.value.status_code == status
        assert json.loads(info.value.body)["error"]["code"] == code


async def test_hello_for_a_queue_without_consume_scope_is_closed_1008(full_node, db):
    tenant = await make_tenant(db, "scope", queues=("q1", "q2"))
    from ..nodeutil import make_token

    token = await make_token(db, tenant, {"workers:connect": "*", "workers:consume": [tenant.queues["q1"]]})
    headers = [(b"authorization", f"Bearer {token}".encode())]
    with trio.fail_after(10):
        async with open_websocket_url(ws_url(full_node.base_url), extra_headers=headers) as ws:
            await ws.send_message(
                json.dumps({"type": "hello", "queues": [tenant.queues["q2"]], "capabilities": [CAP], "capacity": 1})
            )
            message = json.loads(await ws.get_message())
            validate_message(message, direction="node")
            assert message["code"] == "PERMISSION_DENIED" and message["field"] == "queues[0]"
            from trio_websocket import ConnectionClosed

            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1008


async def test_message_before_hello_and_malformed_messages(full_node, db):
    tenant = await make_tenant(db, "bad")
    headers = [(b"authorization", f"Bearer {tenant.token}".encode())]
    from trio_websocket import ConnectionClosed

    with trio.fail_after(10):
        async with open_websocket_url(ws_url(full_node.base_url), extra_headers=headers) as ws:
            await ws.send_message("{nope")
            message = json.loads(await ws.get_message())
            assert message["type"] == "error" and message["code"] == "MALFORMED_MESSAGE"
            await ws.send_message(
                json.dumps({"type": "start", "tasks": [{"task_id": "a" * 32, "token": "1-" + "a" * 16}]})
            )
            message = json.loads(await ws.get_message())
            assert message["code"] == "OUT_OF_ORDER"
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 4002
        # The node is fine: health still answers.
        async with httpx.AsyncClient() as http:
            assert (await http.get(full_node.base_url + "/healthz")).status_code == 200


async def test_oversized_message_closes_1009_and_spares_other_connections(node_config, db):
    import attrs
    from trio_websocket import ConnectionClosed

    config = attrs.evolve(node_config, max_ws_message_bytes=4096)
    tenant = await make_tenant(db, "big-msg")
    headers = [(b"authorization", f"Bearer {tenant.token}".encode())]
    async with run_node(config, services=default_services()) as node:
        with trio.fail_after(15):
            async with (
                open_websocket_url(ws_url(node.base_url), extra_headers=headers) as healthy,
                open_websocket_url(ws_url(node.base_url), extra_headers=headers) as ws,
            ):
                await ws.send_message(json.dumps({"type": "heartbeat", "pad": "x" * 10_000}))
                with pytest.raises(ConnectionClosed) as info:
                    await ws.get_message()
                assert info.value.reason.code == 1009
                await healthy.send_message(json.dumps({"type": "heartbeat"}))
                assert json.loads(await healthy.get_message()) == {"type": "heartbeat"}


async def test_tls_node_serves_https_and_wss(node_config, db, tmp_path):
    import ssl

    import attrs
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    config = attrs.evolve(node_config, tls_cert=str(cert_path), tls_key=str(key_path))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    tenant = await make_tenant(db, "tls")
    async with run_node(config, services=default_services()) as node:
        assert node.base_url.startswith("https://")
        async with httpx.AsyncClient(verify=client_ctx) as http:
            assert (await http.get(node.base_url + "/healthz")).status_code == 200
        async with OrbitClient(
            node.base_url, tenant.token, transport=httpx.AsyncHTTPTransport(verify=client_ctx)
        ) as client:
            await submit(client, "tls-1", tenant.queue_id, 3)
        worker = Worker(
            url=node.base_url, token=tenant.token, queues=[tenant.queue_id], capacity=1, ssl_context=client_ctx
        )
        seen = []

        @worker.handler("object.prepare", "v1", "v1")
        async def prepare(task: WorkerTask):
            seen.append(task.priority)
            return None

        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await worker.wait_completed(1)
                await worker.drain()
        assert seen == [3]
