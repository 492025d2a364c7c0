"""The node's Worker side end to end (real WebSockets, real MariaDB): limits, leases, fairness, shutdown."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from orbit_node.db import Database
from orbit_node.domain.ownership import OwnershipLost
from orbit_node.node import Node
from orbit_node.services import default_services
from orbit_node.store.tenancy import TenancyStore
from orbit_sdk.worker import Worker

from .. import seed
from ..checks import wait_for_state
from ..helpers import application_rows_locked, wait_until
from ..nodeutil import ALL_SCOPES, run_node
from ..wsclient import heartbeat_roundtrip, raw_worker, ws_url


async def token_for(db: Database, owner: seed.Tenant) -> str:
    _, token = await TenancyStore(db).create_credential(owner.namespace_id, "t", ALL_SCOPES)
    return token


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


async def test_the_129th_connection_is_refused_and_the_others_keep_working(full_node, db):
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    headers = [(b"authorization", f"Bearer {token}".encode())]
    url = ws_url(full_node.base_url)
    hub = full_node.node.state.services.hub
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            opened = []
            release = trio.Event()

            async def hold(task_status=trio.TASK_STATUS_IGNORED):
                async with open_websocket_url(url, extra_headers=headers) as ws:
                    opened.append(ws)
                    task_status.started()
                    await release.wait()

            for _ in range(128):
                await nursery.start(hold)
            assert hub.admitted == 128
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(url, extra_headers=headers):
                    pass
            assert info.value.status_code == 503
            body = json.loads(info.value.body)
            assert body["error"]["code"] == "RESOURCE_EXHAUSTED" and "128" in body["error"]["message"]
            assert hub.refused == 1
            # The existing connections are untouched: one of them does a full hello/heartbeat.
            ws = opened[0]
            await ws.send_message(json.dumps({"type": "heartbeat"}))
            assert json.loads(await ws.get_message()) == {"type": "heartbeat"}
            release.set()
    # Slots are given back when connections end.
    await wait_until(lambda: not hub.admitted)


async def test_worker_disconnecting_mid_task_task_comes_back_after_lease_expiry_old_finish_refused(full_node, db):
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    task_id = await seed.insert_task(db, owner)
    store = full_node.node.state.services.shards.main.leases
    with trio.fail_after(20):
        async with raw_worker(full_node.base_url, token) as w:
            await w.hello([owner.queue_id])
            dispatch = await w.recv_type("dispatch")
            old = dispatch["tasks"][0]
            ack = await w.request("start", [{"task_id": task_id, "token": old["token"]}], "s")
            assert ack["results"][0]["ok"]
        # The connection is gone while the task runs: it stays running under its lease.
        row = await seed.task_row(db, task_id)
        assert row["state"] == "running" and row["fencing_token"] == old["token"]
        assert (await store.recover()).total == 0  # the lease is still valid: nothing moves
        await seed.expire_lease(db, task_id)
        stats = await store.recover()
        assert stats.retried == 1
        await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET available_at = NOW(6) WHERE task_id = %s", (task_id,)))
        async with raw_worker(full_node.base_url, token) as w2:
            await w2.hello([owner.queue_id])
            again = (await w2.recv_type("dispatch"))["tasks"][0]
            assert again["task_id"] == task_id and again["attempt"] == 2 and again["token"] != old["token"]
            with pytest.raises(OwnershipLost):
                await store.finish(task_id, old["token"], result_json="{}")
            ack = await w2.request("start", [{"task_id": task_id, "token": again["token"]}], "s2")
            assert ack["results"][0]["ok"]
            ack = await w2.request(
                "finish", [{"task_id": task_id, "token": again["token"], "outcome": "succeeded", "result": 1}], "f2"
            )
            assert ack["results"][0]["state"] == "succeeded"
    row = await seed.task_row(db, task_id)
    assert row["state"] == "succeeded" and row["attempts"] == 2


async def test_reservations_of_a_closed_connection_are_released_at_once(full_node, db):
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    task_id = await seed.insert_task(db, owner)
    with trio.fail_after(20):
        async with raw_worker(full_node.base_url, token) as w:
            await w.hello([owner.queue_id])
            await w.recv_type("dispatch")
        await wait_for_state(db, task_id, "queued")
    row = await seed.task_row(db, task_id)
    assert row["state"] == "queued" and row["attempts"] == 0 and row["owner_node_id"] is None
    assert [a["outcome"] for a in await seed.attempt_rows(db, task_id)] == ["released"]


async def test_heartbeats_are_answered_while_every_sql_slot_is_stalled(full_node, db, dsn):
    owners, tokens = [], []
    for i in range(4):
        owner = await seed.tenant(db, application=f"app{i}")
        await TenancyStore(db).set_application_quota(
            owner.application_id, max_concurrent_executions=10, max_starts_per_second=None
        )
        await seed.insert_task(db, owner)
        owners.append(owner)
        tokens.append(await token_for(db, owner))
    pool = full_node.node.state.services.pool
    with trio.fail_after(40):
        async with (
            raw_worker(full_node.base_url, tokens[0]) as w0,
            raw_worker(full_node.base_url, tokens[1]) as w1,
            raw_worker(full_node.base_url, tokens[2]) as w2,
            raw_worker(full_node.base_url, tokens[3]) as w3,
        ):
            workers = [w0, w1, w2, w3]
            # Claims of these applications lock their application row (quota): hold them all.
            async with application_rows_locked(dsn, [owner.application_id for owner in owners]):
                for w, owner in zip(workers, owners, strict=True):
                    await w.hello([owner.queue_id])
                await wait_until(lambda: pool.statistics().in_flight >= 4)
                # All four claim slots wait on the database; the control loops do not.
                for _ in range(3):
                    for w in workers:
                        with trio.fail_after(2):
                            await heartbeat_roundtrip(w)
                assert pool.statistics().in_flight == 4
            for w in workers:
                assert len((await w.recv_type("dispatch"))["tasks"]) == 1


async def test_a_flooding_application_does_not_delay_another_beyond_one_rotation(full_node, db):
    pool = full_node.node.state.services.pool
    granted: list[str] = []
    requested_at: list[int] = []  # len(granted) when each of the small application's requests entered
    flooding = trio.Event()  # the big application has had 20 turns

    def on_grant(grant):
        granted.append(grant.request.application_id)
        if not flooding.is_set() and granted.count(big.application_id) >= 20:
            flooding.set()

    pool.on_grant = on_grant
    big = await seed.tenant(db, application="big", queue="q0")
    queues = [big] + [await seed.add_queue(db, big, f"q{i}") for i in range(1, 10)]
    for q in queues:
        await seed.bulk_insert_tasks(db, q, 2000, id_prefix=q.queue_id[:8])
    big_token = await token_for(db, big)
    small = await seed.tenant(db, application="small")
    small_token = await token_for(db, small)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            stop = trio.Event()

            async def flood(queue_id, task_status=trio.TASK_STATUS_IGNORED):
                # Capacity 1000: keeps claiming without ever starting (reservations pile up).
                async with raw_worker(full_node.base_url, big_token) as w:
                    await w.hello([queue_id], capacity=1000)
                    task_status.started()
                    await stop.wait()

            for q in queues:
                for _ in range(4):
                    await nursery.start(flood, q.queue_id)
            await flooding.wait()
            pool.on_request = lambda t: (
                requested_at.append(len(granted)) if t.application_id == small.application_id else None
            )
            await seed.insert_task(db, small)
            async with raw_worker(full_node.base_url, small_token) as w:
                await w.hello([small.queue_id])
                dispatch = await w.recv_type("dispatch")
                assert len(dispatch["tasks"]) == 1
            # Between the small application's request and its grant, the big one got at most one turn.
            after_request = granted[requested_at[0] :]
            first_small = after_request.index(small.application_id)
            assert after_request[:first_small].count(big.application_id) <= 1, first_small
            # The big application was still flooding when the small one was served.
            assert pool.statistics().pending >= 30
            stop.set()
    turns = pool.statistics().turns_by_application
    assert turns[small.application_id] >= 1 and turns[big.application_id] >= 20


async def test_node_shutdown_with_work_in_flight_loses_no_task(node_config, db):
    """A node restarted under a Worker whose handlers run: the Worker moves (the node's
    drain), its handlers go on, and their tasks are re-attached and reported on the node
    that comes back at the same address; nothing is lost or run twice."""
    import attrs

    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    ids = await seed.insert_tasks(db, owner, [seed.TaskSpec() for _ in range(20)])
    busy = trio.Event()  # all five of the Worker's slots run a task
    finish = trio.Event()
    ran = []

    async def handler(task):
        ran.append(task.task_id)
        if len(ran) == 5:
            busy.set()
        await finish.wait()
        return {"done": task.task_id}

    with trio.fail_after(40):
        async with trio.open_nursery() as outer:
            async with run_node(node_config, services=default_services()) as running:
                worker = Worker(url=running.base_url, token=token, queues=[owner.queue_id], capacity=5)
                worker.register("h", "v1", "v1", handler)
                await outer.start(worker.run)
                await busy.wait()
                port = int(running.base_url.rsplit(":", 1)[1])
                running.node.request_shutdown()
            # The node has exited; the handlers still run. It comes back at the same address.
            assert len(ran) == 5
            async with run_node(attrs.evolve(node_config, http_port=port), services=default_services()):
                await wait_until(lambda: worker.connections >= 2)
                finish.set()
                await worker.wait_completed(20)
                await worker.drain()
    states = await seed.count_states(db)
    assert states == {"succeeded": 20}, states
    assert sorted(ran) == sorted(ids), "each task ran once"
    for task_id in ids:
        assert (await seed.task_row(db, task_id))["attempts"] == 1


async def test_idle_connections_close_promptly_on_shutdown(node_config, db):
    """A connection whose claim request is pending (nothing to do) must not hold the shutdown
    for the whole grace period: it gets drain, then close 1001."""
    import attrs
    from trio_websocket import ConnectionClosed

    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    config = attrs.evolve(node_config, shutdown_grace_s=60)
    with trio.fail_after(10):
        async with run_node(config, services=default_services()) as running:
            async with raw_worker(running.base_url, token) as w:
                await w.hello([owner.queue_id])
                pool = running.node.state.services.pool
                await wait_until(lambda: pool.statistics().claims_empty >= 1)
                running.node.request_shutdown()
                await w.recv_type("drain")
                with pytest.raises(ConnectionClosed) as info:
                    await w.recv()
                assert info.value.reason.code == 1001


async def test_a_claim_in_flight_at_shutdown_finishes_and_gives_its_reservations_back(node_config, db, dsn, caplog):
    """The Worker leaves while its claim waits on the database and HTTP stops: the node keeps
    its services until the claim has finished, and the reservation it made is given back at
    once (an attempt closed as released), not dropped for lease recovery."""
    import logging

    caplog.set_level(logging.INFO, logger="orbit.node")
    owner = await seed.tenant(db)
    await TenancyStore(db).set_application_quota(
        owner.application_id, max_concurrent_executions=10, max_starts_per_second=None
    )
    task_id = await seed.insert_task(db, owner)
    token = await token_for(db, owner)
    node = Node(attrs.evolve(node_config, shutdown_grace_s=30), services=default_services())
    stopped = trio.Event()

    async def run_node_until_stopped(task_status=trio.TASK_STATUS_IGNORED):
        try:
            await node.run(task_status=task_status)
        finally:
            stopped.set()

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(run_node_until_stopped)
            pool = node.state.services.pool
            # The claim locks its application row (quota): held, the claim stays in flight.
            async with application_rows_locked(dsn, [owner.application_id]):
                async with raw_worker(bound[0], token) as w:
                    await w.hello([owner.queue_id])
                    await wait_until(lambda: pool.statistics().in_flight == 1)
                    node.request_shutdown()
                    await w.recv_type("drain")
                # The Worker is gone and HTTP has stopped; the claim still waits on the lock.
                await wait_until(lambda: "waiting for 1 in-flight claims" in caplog.text)
                assert not stopped.is_set()
            await stopped.wait()
    assert pool.statistics().claims_with_tasks == 1
    row = await seed.task_row(db, task_id)
    assert row["state"] == "queued"
    attempts = await db.run(
        lambda tx: tx.fetchall_raw("SELECT outcome FROM task_attempts WHERE task_id = %s", (task_id,))
    )
    assert [a["outcome"] for a in attempts] == ["released"], attempts
