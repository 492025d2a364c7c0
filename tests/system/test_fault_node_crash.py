"""A node process killed with SIGKILL at the worst moments (real process, MariaDB, WebSockets)."""

from __future__ import annotations

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed

from harness.nodeproc import NodeProcess
from harness.proxy import Direction, open_fault_proxy
from orbit_node.domain.ownership import OwnershipLost

from .. import seed
from ..checks import assert_attempt_history, rows, tenant_with_token, wait_for_state
from ..helpers import wait_until
from ..nodeutil import make_tenant
from ..wsclient import raw_worker


async def node_id_of(node: NodeProcess) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(node.base_url + "/healthz")).json()["data"]["node_id"]


async def test_node_killed_after_a_claim_commits_before_the_dispatch_arrives(dsn, db, tmp_path):
    """Scenario 1. The Worker's connection runs through a proxy that holds every frame the
    node sends; the node commits a claim of two tasks and is SIGKILLed before the dispatch
    arrives. A restarted node re-dispatches each task only once its reservation lease has
    expired on the database clock, never earlier; the old tokens are refused."""
    owner, token = await tenant_with_token(db)
    node = NodeProcess(dsn, tmp_path / "node.log")
    await node.start()
    try:
        old_node = await node_id_of(node)
        with trio.fail_after(40):
            async with open_fault_proxy("127.0.0.1", node.port) as ws_proxy:
                async with raw_worker(f"http://127.0.0.1:{ws_proxy.port}", token) as lost:
                    await lost.hello([owner.queue_id], capacity=2)
                    ws_proxy.stall(Direction.DOWN)
                    probe, task_id = await seed.insert_tasks(db, owner, [seed.TaskSpec(), seed.TaskSpec()])
                    await wait_for_state(db, probe, "reserved")
                    await wait_for_state(db, task_id, "reserved")
                    await node.kill()
                    ws_proxy.reset()
                    # The connection died with the node; the dispatch never arrived.
                    with pytest.raises(ConnectionClosed):
                        await lost.recv()
            row = await seed.task_row(db, task_id)
            assert (row["owner_node_id"], row["attempts"]) == (old_node, 0)
            old_token = row["fencing_token"]
            # Only the probe's lease runs out: the restarted node's sweeper requeues it, and
            # the same pass sees the task's lease still valid on the database clock.
            await seed.expire_lease(db, probe)
            await node.start()
            async with raw_worker(node.base_url, token) as w:
                await w.hello([owner.queue_id], capacity=2)
                first = (await w.recv_type("dispatch"))["tasks"]
                assert [t["task_id"] for t in first] == [probe]
                row = await seed.task_row(db, task_id)
                assert (row["state"], row["fencing_token"], row["owner_node_id"]) == ("reserved", old_token, old_node)
                # Now its lease runs out too: it comes back, same attempt number, new token.
                await seed.expire_lease(db, task_id)
                again = (await w.recv_type("dispatch"))["tasks"]
                assert [(t["task_id"], t["attempt"]) for t in again] == [(task_id, 1)]
                new_token = again[0]["token"]
                assert new_token != old_token
                store = seed.lease_store(db)
                for transition in (store.start, store.renew, store.release):
                    with pytest.raises(OwnershipLost):
                        await transition(task_id, old_token)
                with pytest.raises(OwnershipLost):
                    await store.finish(task_id, old_token, result_json='"stale"')
                ack = await w.request("start", [{"task_id": task_id, "token": old_token}], "old")
                assert ack["results"][0] == {"task_id": task_id, "ok": False, "code": "NOT_HELD"}
                ref = {"task_id": task_id, "token": new_token}
                assert (await w.request("start", [ref], "s"))["results"][0]["ok"]
                ack = await w.request("finish", [{**ref, "outcome": "succeeded", "result": "ok"}], "f")
                assert ack["results"][0]["state"] == "succeeded"
    finally:
        await node.aclose()
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"], row["result"]) == ("succeeded", 1, '"ok"')
    history = await assert_attempt_history(db, task_id)
    assert [(a["outcome"], a["fencing_token"]) for a in history] == [
        ("reservation_expired", old_token),
        ("succeeded", new_token),
    ]


async def test_a_retry_after_a_crash_between_commit_and_response_returns_the_same_task(dsn, db, tmp_path):
    """Scenario 9. The node commits an accepted task and is SIGKILLed before its answer
    reaches the client (the proxy drops the node's bytes). The client's retry with the
    same key, to the restarted node, returns the same task; nothing is created twice."""
    tenant = await make_tenant(db, "idem")
    key = "crash-between-insert-and-response"
    body = {
        "queue_id": tenant.queue_id,
        "handler": "h",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {"n": 12345678901234567890123},
        "priority": 4,
    }
    headers = {"Authorization": f"Bearer {tenant.token}", "Idempotency-Key": key}
    node = NodeProcess(dsn, tmp_path / "node.log")
    await node.start()
    try:
        with trio.fail_after(40):
            async with open_fault_proxy("127.0.0.1", node.port) as http_proxy:
                http_proxy.blackhole(Direction.DOWN)
                outcome: list = []
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_proxy.port}", timeout=30) as http:
                    async with trio.open_nursery() as nursery:

                        async def submit():
                            try:
                                outcome.append(await http.post("/v1/tasks", json=body, headers=headers))
                            except httpx.TransportError as exc:
                                outcome.append(exc)

                        nursery.start_soon(submit)
                        await wait_until(
                            lambda: rows(db, "SELECT task_id FROM idempotency_records WHERE idempotency_key = %s", key)
                        )
                        await node.kill()
                        # The dead process's connection is gone; its answer never came through.
                        http_proxy.reset()
                assert isinstance(outcome[0], httpx.TransportError), outcome
            stored = await rows(db, "SELECT task_id FROM tasks")
            assert len(stored) == 1
            await node.start()
            async with httpx.AsyncClient(base_url=node.base_url, timeout=30) as http:
                retry = await http.post("/v1/tasks", json=body, headers=headers)
                assert retry.status_code == 200, retry.text
                task = retry.json()["data"]
                assert task["task_id"] == stored[0]["task_id"] and task["priority"] == 4
                assert task["payload"] == {"n": 12345678901234567890123}
                changed = await http.post("/v1/tasks", json={**body, "priority": 5}, headers=headers)
                assert changed.status_code == 409 and changed.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    finally:
        await node.aclose()
    assert len(await rows(db, "SELECT task_id FROM tasks")) == 1
    assert len(await rows(db, "SELECT task_id FROM idempotency_records")) == 1
