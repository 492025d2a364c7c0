"""Worker connection slots shared between applications, end to end (real WebSockets, real
MariaDB): on a full node an application under its fair share still connects and one
connection of the application over its share is moved away; the per-application limit."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from unittest.mock import ANY

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from orbit_node.db import Database
from orbit_node.services import default_services
from orbit_node.store.operations import OperationsStore
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..helpers import wait_until
from ..nodeutil import ALL_SCOPES, run_node
from ..wsclient import RawWorker, heartbeat_roundtrip, raw_worker, ws_url

# The documented close of a connection moved away (docs/worker-protocol.md).
CLOSE_MOVED = 4004
MOVED_REASON = "moved: node full, reconnect elsewhere"


async def token_for(db: Database, owner: seed.Tenant) -> str:
    _, token = await TenancyStore(db).create_credential(owner.namespace_id, "t", ALL_SCOPES)
    return token


@pytest.fixture
async def small_node(node_config):
    async with run_node(attrs.evolve(node_config, max_connections=4), services=default_services()) as running:
        yield running


async def refused(base_url: str, token: str) -> tuple[int, dict, str | None]:
    """Status, error and Retry-After of a refused Worker handshake."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(ws_url(base_url), extra_headers=headers):
            pass
    retry_after = dict(info.value.headers or []).get(b"retry-after")
    return info.value.status_code, json.loads(info.value.body)["error"], retry_after and retry_after.decode()


async def rest_of(worker: RawWorker) -> tuple[list[str], int, str]:
    """The types of the messages left for ``worker`` and the code and reason the node closed
    it with."""
    kinds = [m["type"] for m in worker.inbox]
    with pytest.raises(ConnectionClosed) as info:
        while True:
            kinds.append((await worker.recv())["type"])
    assert info.value.reason is not None
    return kinds, info.value.reason.code, info.value.reason.reason


def closed(workers: list[RawWorker]) -> list[RawWorker]:
    return [w for w in workers if w.ws.closed is not None]


async def test_a_full_node_moves_a_connection_of_the_application_over_its_share(small_node, db):
    a = await seed.tenant(db, application="app-a")
    b = await seed.tenant(db, application="app-b")
    token_a, token_b = await token_for(db, a), await token_for(db, b)
    hub = small_node.node.state.services.hub
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            workers_a = []
            for _ in range(4):
                w = await stack.enter_async_context(raw_worker(small_node.base_url, token_a))
                await w.hello([a.queue_id])
                workers_a.append(w)
            await wait_until(lambda: len(hub.connections) == 4)
            assert hub.held == {a.application_id: 4}

            # B holds nothing: it connects, and one of A's connections is told to drain and
            # closed with the documented code.
            wb = await stack.enter_async_context(raw_worker(small_node.base_url, token_b))
            await wb.hello([b.queue_id])
            assert hub.held == {a.application_id: 3, b.application_id: 1} and hub.moved == 1
            await wait_until(lambda: bool(closed(workers_a)))
            (gone,) = closed(workers_a)
            assert await rest_of(gone) == (["drain"], CLOSE_MOVED, MOVED_REASON)
            left = [w for w in workers_a if w is not gone]

            # A is over its share (2 of 4): its next connection is refused at the handshake.
            status, error, retry_after = await refused(small_node.base_url, token_a)
            assert (status, error["code"], error["field"], retry_after) == (
                503,
                "RESOURCE_EXHAUSTED",
                "connections",
                "1",
            )
            assert hub.refusals["node_full"] == 1

            # B's second connection is still within its share: another of A's is moved.
            wb2 = await stack.enter_async_context(raw_worker(small_node.base_url, token_b))
            await wb2.hello([b.queue_id])
            await wait_until(lambda: bool(closed(left)))
            (gone,) = closed(left)
            assert await rest_of(gone) == (["drain"], CLOSE_MOVED, MOVED_REASON)
            assert hub.held == {a.application_id: 2, b.application_id: 2} and hub.moved == 2
            # Now both are at their share: both are refused.
            for token in (token_a, token_b):
                assert (await refused(small_node.base_url, token))[:2] == (503, {**error, "message": ANY})
            assert hub.refusals == {"node_full": 3, "application_limit": 0}
            # The connections left keep working.
            for w in [wb, wb2, *[w for w in left if w is not gone]]:
                await w.send({"type": "heartbeat"})
                await w.recv_type("heartbeat")
    await wait_until(lambda: not hub.admitted and not hub.held)


async def test_an_application_limit_refuses_connections_beyond_it(small_node, db):
    a = await seed.tenant(db, application="app-a")
    b = await seed.tenant(db, application="app-b")
    await OperationsStore(db).set_max_worker_connections("app-a", 2)
    token_a, token_b = await token_for(db, a), await token_for(db, b)
    hub = small_node.node.state.services.hub
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            for _ in range(2):
                w = await stack.enter_async_context(raw_worker(small_node.base_url, token_a))
                await w.hello([a.queue_id])
            # The node has room, but A holds its own maximum.
            status, error, retry_after = await refused(small_node.base_url, token_a)
            assert (status, error["code"], error["field"], retry_after) == (
                503,
                "RESOURCE_EXHAUSTED",
                "max_worker_connections",
                "1",
            )
            assert "2" in error["message"]
            assert hub.refusals == {"node_full": 0, "application_limit": 1}
            # Another application is not concerned.
            wb = await stack.enter_async_context(raw_worker(small_node.base_url, token_b))
            await wb.hello([b.queue_id])
            # Lifted: the next handshake reads it (no cache between).
            await OperationsStore(db).set_max_worker_connections("app-a", None)
            w = await stack.enter_async_context(raw_worker(small_node.base_url, token_a))
            await w.hello([a.queue_id])
            assert hub.held == {a.application_id: 3, b.application_id: 1}


async def test_the_connection_moved_away_holds_the_fewest_tasks_and_finishes_them_first(small_node, db):
    """Three of A's connections run a task each, one is idle: the idle one is moved. With
    all four busy, the one moved is told to drain, finishes its task (which succeeds) and
    only then is closed with the documented code."""
    a = await seed.tenant(db, application="app-a")
    b = await seed.tenant(db, application="app-b")
    token_a, token_b = await token_for(db, a), await token_for(db, b)
    hub = small_node.node.state.services.hub

    async def running(w: RawWorker, n: int) -> dict:
        """``w`` says hello and starts the task it is sent."""
        await w.hello([a.queue_id])
        task = (await w.recv_type("dispatch"))["tasks"][0]
        ack = await w.request("start", [{"task_id": task["task_id"], "token": task["token"]}], f"s{n}")
        assert ack["results"][0]["ok"]
        return task

    with trio.fail_after(30):
        await seed.insert_tasks(db, a, [seed.TaskSpec() for _ in range(3)])
        async with AsyncExitStack() as stack:
            busy = [await stack.enter_async_context(raw_worker(small_node.base_url, token_a)) for _ in range(3)]
            tasks = [await running(w, n) for n, w in enumerate(busy)]
            idle = await stack.enter_async_context(raw_worker(small_node.base_url, token_a))
            await idle.hello([a.queue_id])
            await wait_until(lambda: len(hub.connections) == 4)
            wb = await stack.enter_async_context(raw_worker(small_node.base_url, token_b))
            await wb.hello([b.queue_id])
            assert await rest_of(idle) == (["drain"], CLOSE_MOVED, MOVED_REASON)
            assert not closed(busy)
        await wait_until(lambda: not hub.admitted)

        # All four busy now: the one moved drains first.
        await seed.insert_tasks(db, a, [seed.TaskSpec() for _ in range(4)])
        async with AsyncExitStack() as stack:
            busy = [await stack.enter_async_context(raw_worker(small_node.base_url, token_a)) for _ in range(4)]
            tasks = [await running(w, n) for n, w in enumerate(busy)]
            await wait_until(lambda: len(hub.connections) == 4)
            wb = await stack.enter_async_context(raw_worker(small_node.base_url, token_b))
            await wb.hello([b.queue_id])
            drained: list[int] = []
            async with trio.open_nursery() as nursery:

                async def watch(n: int, w: RawWorker) -> None:
                    await w.recv_type("drain")
                    drained.append(n)
                    nursery.cancel_scope.cancel()

                for n, w in enumerate(busy):
                    nursery.start_soon(watch, n, w)
            (n,) = drained
            # Told to drain, it is not closed while its task runs.
            await heartbeat_roundtrip(busy[n])
            assert not closed(busy)
            task = tasks[n]
            ref = {"task_id": task["task_id"], "token": task["token"]}
            ack = await busy[n].request("finish", [{**ref, "outcome": "succeeded", "result": 1}], "f")
            assert ack["results"][0]["ok"]
            assert await rest_of(busy[n]) == ([], CLOSE_MOVED, MOVED_REASON)
            assert (await seed.task_row(db, task["task_id"]))["state"] == "succeeded"
            assert hub.moved == 2
