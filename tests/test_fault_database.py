"""Database faults against a running node: a killed session, a stalled or black-holed
network, a ``kill -9`` of mariadbd, recovery racing Finish (real MariaDB, real WebSockets)."""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio

from orbit_node.db import Database, migrate
from orbit_node.services import default_services
from orbit_node.store.dispatch import DispatchStore, RecoveryStats

from . import seed
from .faults.checks import assert_attempt_history, rows, tenant_with_token, wait_for_state
from .faults.clock import LaterDatabase
from .faults.mariadb import PrivateMariaDB
from .faults.nodeproc import NodeProcess
from .faults.proxy import open_fault_proxy
from .nodeutil import make_tenant, run_node
from .wsclient import heartbeat_roundtrip, raw_worker


async def node_transaction_threads(db: Database) -> list[int]:
    """Server thread ids of other sessions on this test's database with an open InnoDB transaction."""
    found = await rows(
        db,
        "SELECT p.ID AS id FROM information_schema.INNODB_TRX t "
        "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
        "WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()",
    )
    return [r["id"] for r in found]


async def locked_state(db: Database, task_id: str) -> str:
    """The task's state read with a lock: waits until no uncommitted change is left on the row."""

    async def body(tx):
        found = await tx.fetchall_raw("SELECT state FROM tasks WHERE task_id = %s FOR UPDATE", (task_id,))
        return found[0]["state"]

    return await db.transaction(body)


# -- scenario 4 --------------------------------------------------------------------------------


async def test_kill_of_the_claim_session_rolls_back_and_the_node_reconnects_by_itself(node_config, db):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as running:
        store = running.node.state.services["dispatch"]
        pool = running.node.state.services["claims"]
        reserved, resume = trio.Event(), trio.Event()

        async def hook(point, task_ids):
            if point == "claim.reserved" and not reserved.is_set():
                reserved.set()
                await resume.wait()

        store.hook = hook
        with trio.fail_after(20):
            async with raw_worker(running.base_url, token) as w:
                await w.hello([owner.queue_id])
                await reserved.wait()
                # The claim has written its reservation and attempt row, not committed.
                threads = await node_transaction_threads(db)
                assert len(threads) == 1, threads
                await db.run(lambda tx: tx.execute_raw(f"KILL {int(threads[0])}"))
                resume.set()
                # The server rolled the claim back: nothing stuck reserved, no attempt used.
                assert await locked_state(db, task_id) == "queued"
                row = await seed.task_row(db, task_id)
                assert (row["attempts"], row["owner_node_id"], row["fencing_token"]) == (0, None, None)
                assert await seed.attempt_rows(db, task_id) == []
                # The node noticed, dropped that connection and claims again by itself.
                dispatch = await w.recv_type("dispatch")
                again = dispatch["tasks"][0]
                assert again["task_id"] == task_id and again["attempt"] == 1
                ack = await w.request("start", [{"task_id": task_id, "token": again["token"]}], "s")
                assert ack["results"][0]["ok"]
                ack = await w.request(
                    "finish", [{"task_id": task_id, "token": again["token"], "outcome": "succeeded", "result": 1}], "f"
                )
                assert ack["results"][0]["state"] == "succeeded"
        assert pool.statistics().claims_failed == 1
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["succeeded"]


# -- scenario 6 --------------------------------------------------------------------------------


async def test_database_stalled_longer_than_the_lease_no_second_concurrent_run(node_config, db, dsn):
    """Node 1 reaches the database through a proxy that stalls; node 2 directly.

    While node 1's database traffic is held, the running attempt's lease runs out on the
    database clock; node 2 recovers the task and runs it again. When the stall ends, the
    first Worker's renew and finish are refused: there was never a second run beyond the
    lease. Heartbeats of node 1's connections are answered throughout the stall.
    """
    owner, token = await tenant_with_token(db)
    idle_queue = await seed.add_queue(db, owner, "idle")
    task_id = await seed.insert_task(db, owner, backoff_initial_ms=1, backoff_max_ms=1)
    async with open_fault_proxy(dsn.host, dsn.port) as proxy, \
            run_node(attrs.evolve(node_config, dsn=proxy.dsn_for(dsn)), services=default_services()) as node1, \
            run_node(node_config, services=default_services()) as node2:
        with trio.fail_after(30):
            async with raw_worker(node1.base_url, token) as first, raw_worker(node1.base_url, token) as healthy:
                await first.hello([owner.queue_id])
                await healthy.hello([idle_queue.queue_id])
                old = (await first.recv_type("dispatch"))["tasks"][0]
                ref = {"task_id": task_id, "token": old["token"]}
                assert (await first.request("start", [ref], "s1"))["results"][0]["ok"]

                proxy.stall()
                await first.send({"type": "renew", "id": "r1", "tasks": [ref]})
                await first.send({"type": "finish", "id": "f1", "tasks": [{**ref, "outcome": "succeeded", "result": "first"}]})
                # The lease runs out on the database clock while node 1 cannot reach it.
                await seed.expire_lease(db, task_id)
                async with raw_worker(node2.base_url, token) as second:
                    await second.hello([owner.queue_id])
                    again = (await second.recv_type("dispatch"))["tasks"][0]  # node 2's sweeper requeued it
                    assert again["task_id"] == task_id and again["attempt"] == 2
                    new = {"task_id": task_id, "token": again["token"]}
                    assert (await second.request("start", [new], "s2"))["results"][0]["ok"]
                    # Node 1's control loops never waited on the stalled database.
                    for _ in range(3):
                        for w in (first, healthy):
                            with trio.fail_after(1):
                                await heartbeat_roundtrip(w)
                    assert proxy.open_links > 0
                    proxy.heal()
                    renew = await first.recv_type("ack")
                    finish = await first.recv_type("ack")
                    assert renew["id"] == "r1" and renew["results"][0]["ok"] is False
                    assert renew["results"][0]["code"] == "OWNERSHIP_LOST"
                    assert finish["id"] == "f1" and finish["results"][0]["ok"] is False
                    row = await seed.task_row(db, task_id)
                    assert (row["state"], row["fencing_token"]) == ("running", again["token"])
                    ack = await second.request("finish", [{**new, "outcome": "succeeded", "result": "second"}], "f2")
                    assert ack["results"][0]["state"] == "succeeded"
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"], row["result"]) == ("succeeded", 2, '"second"')
    history = await assert_attempt_history(db, task_id)
    assert [a["outcome"] for a in history] == ["lease_expired", "succeeded"]


async def test_a_black_holed_database_connection_does_not_wedge_the_node(node_config, db, dsn):
    """Answers lost in the network (no RST, no FIN) must not hold the node's sweeper, claim
    slots or transitions forever: once the network is back the node works without a restart."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    config = attrs.evolve(node_config, db_operation_timeout_s=2.0)
    async with open_fault_proxy(dsn.host, dsn.port) as proxy, \
            run_node(attrs.evolve(config, dsn=proxy.dsn_for(dsn)), services=default_services()) as node:
        sweeper_passes = node.node.state.services["sweeper"]
        with trio.fail_after(30):
            async with raw_worker(node.base_url, token) as w:
                await w.hello([owner.queue_id])
                held = (await w.recv_type("dispatch"))["tasks"][0]
                ref = {"task_id": task_id, "token": held["token"]}
                proxy.blackhole()
                await w.send({"type": "start", "id": "s1", "tasks": [ref]})
                ack = await w.recv_type("ack")
                # The start could not be confirmed: a negative ack the Worker may retry.
                assert ack["results"][0] == {"task_id": task_id, "ok": False, "code": "UNAVAILABLE"}
                proxy.heal()
                ack = await w.request("start", [ref], "s2")
                assert ack["results"][0]["ok"]
                ack = await w.request("finish", [{**ref, "outcome": "succeeded", "result": 1}], "f")
                assert ack["results"][0]["state"] == "succeeded"
            # The sweeper and the API still work.
            before = sweeper_passes.passes
            while sweeper_passes.passes < before + 2:
                await trio.sleep(0.05)
            async with node.client(token) as http:
                response = await http.get(f"/v1/tasks/{task_id}")
                assert response.status_code == 200 and response.json()["data"]["state"] == "succeeded"
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["succeeded"]
