"""A Worker connection under abuse and stress: a Worker that never reads, binary frames,
a release after the lease ran out, and transitions while every claim SQL slot is stalled."""

from __future__ import annotations

import secrets

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed

from orbit_node.config import NodeConfig
from orbit_node.db import Database
from orbit_node.domain.errors import ConfigError
from orbit_node.domain.ownership import LostReason, Outcome
from orbit_node.services import default_services
from orbit_node.store.tenancy import TenancyStore
from orbit_node.workers import protocol as p

from .. import seed
from ..helpers import wait_until
from ..nodeutil import ALL_SCOPES, run_node
from ..wsclient import raw_worker


async def token_for(db: Database, owner: seed.Tenant) -> str:
    _, token = await TenancyStore(db).create_credential(owner.namespace_id, "t", ALL_SCOPES)
    return token


async def closed_code(worker) -> int:
    """Read (and schema-check) whatever the node still sends until it closes; the close code."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await worker.recv()
    return info.value.reason.code


def test_the_send_buffer_bounds_come_from_the_environment():
    base = {"ORBIT_MYSQL_DSN": "mysql://r@h/d"}
    default = NodeConfig.from_env(base)
    assert (default.worker_send_buffer_messages, default.worker_send_buffer_bytes) == (1024, 16 * 1024 * 1024)
    config = NodeConfig.from_env(
        {**base, "ORBIT_WORKER_SEND_BUFFER_MESSAGES": "10", "ORBIT_WORKER_SEND_BUFFER_BYTES": "4096"}
    )
    assert (config.worker_send_buffer_messages, config.worker_send_buffer_bytes) == (10, 4096)
    for key, value, field in (
        ("ORBIT_WORKER_SEND_BUFFER_MESSAGES", "0", "ORBIT_WORKER_SEND_BUFFER_MESSAGES"),
        ("ORBIT_WORKER_SEND_BUFFER_BYTES", "many", "ORBIT_WORKER_SEND_BUFFER_BYTES"),
    ):
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env({**base, key: value})
        assert info.value.field == field


async def test_a_worker_that_never_reads_is_closed_as_a_slow_consumer(node_config, db):
    max_messages, max_bytes = 64, 256 * 1024
    config = attrs.evolve(node_config, worker_send_buffer_messages=max_messages, worker_send_buffer_bytes=max_bytes)
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    # 1000 tasks the connection does not hold: each renew is answered NOT_HELD without
    # the database, by an ack of about 60 KB.
    refs = [{"task_id": secrets.token_hex(16), "token": "1-" + secrets.token_hex(8)} for _ in range(1000)]
    async with run_node(config, services=default_services()) as running:
        hub = running.node.state.services.hub
        with trio.fail_after(60):
            async with raw_worker(running.base_url, token) as w:
                await w.hello([owner.queue_id])
                (conn,) = hub.connections.values()
                peak_messages = peak_bytes = sent = 0
                # The Worker heartbeats and asks, and reads nothing: once the socket buffers
                # are full, the node's frames for it pile up in its send buffer.
                while conn.close_code is None:
                    assert sent < 2000, f"still open after {sent} unread acks ({conn.buffered_bytes} bytes queued)"
                    await w.send({"type": "heartbeat"})
                    await w.send({"type": "renew", "id": f"r{sent}", "tasks": refs})
                    sent += 1
                    peak_messages = max(peak_messages, conn.buffered_messages)
                    peak_bytes = max(peak_bytes, conn.buffered_bytes)
                assert conn.close_code == p.CLOSE_SLOW_CONSUMER
                assert 0 < peak_messages <= max_messages and 0 < peak_bytes <= max_bytes
                # What was queued for it is dropped at once, and nothing more is queued.
                assert (conn.buffered_messages, conn.buffered_bytes) == (0, 0)
                await w.send({"type": "heartbeat"})
                await trio.sleep(0.1)
                assert (conn.buffered_messages, conn.buffered_bytes) == (0, 0)
                # Once the Worker reads again, the node's close frame reaches it.
                assert await closed_code(w) == p.CLOSE_SLOW_CONSUMER
        await wait_until(lambda: not hub.connections and not hub.admitted)


async def test_a_binary_frame_is_refused_and_closes_4002(node_config, db):
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    async with run_node(node_config, services=default_services()) as running:
        with trio.fail_after(10):
            async with raw_worker(running.base_url, token) as w:
                await w.hello([owner.queue_id])
                await w.ws.send_message(b'{"type":"heartbeat"}')  # bytes: a binary frame
                error = await w.recv()
                assert error["type"] == "error" and error["code"] == "MALFORMED_MESSAGE"
                assert "binary" in error["message"]
                assert await closed_code(w) == p.CLOSE_PROTOCOL


async def test_a_reservation_whose_lease_expired_cannot_be_released_even_before_recovery(db):
    owner = await seed.tenant(db)
    task_id = await seed.insert_task(db, owner)
    store = seed.lease_store(db)
    (r,) = await store.claim(seed.claim_request(owner, limit=1))
    await seed.expire_lease(db, task_id, seconds_ago=0.001)
    result = (await store.release_many([(task_id, r.fencing_token)]))[0]
    assert (result.ok, result.outcome, result.lost_reason) == (False, Outcome.OWNERSHIP_LOST, LostReason.LEASE_EXPIRED)
    assert result.code == "OWNERSHIP_LOST"
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["fencing_token"]) == ("reserved", r.fencing_token)  # left to the sweeper
    assert [a["outcome"] for a in await seed.attempt_rows(db, task_id)] == [None]
    # The sweeper gives it back the way a release would have, without using an attempt.
    assert (await store.recover()).requeued == 1
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"]) == ("queued", 0)
    assert [a["outcome"] for a in await seed.attempt_rows(db, task_id)] == ["reservation_expired"]


async def test_start_renew_finish_and_drain_flow_while_every_claim_slot_is_stalled(node_config, db, dsn):
    stallers, staller_tokens = [], []
    for i in range(4):
        owner = await seed.tenant(db, application=f"stall{i}")
        await TenancyStore(db).set_application_quota(
            owner.application_id, max_concurrent_executions=10, max_starts_per_second=None
        )
        await seed.insert_task(db, owner)
        stallers.append(owner)
        staller_tokens.append(await token_for(db, owner))
    busy = await seed.tenant(db, application="busy")
    first = await seed.insert_task(db, busy)
    await seed.insert_task(db, busy)
    busy_token = await token_for(db, busy)
    blocker = Database(dsn, size=1)
    locked, done = trio.Event(), trio.Event()

    async def hold_locks(tx):
        # Claims of the stalling applications lock their application row (quota): hold them all.
        for owner in stallers:
            await tx.execute_raw(
                "SELECT * FROM applications WHERE application_id = %s FOR UPDATE", (owner.application_id,)
            )
        locked.set()
        await done.wait()

    try:
        async with run_node(node_config, services=default_services()) as running:
            pool = running.node.state.services.pool
            hub = running.node.state.services.hub
            with trio.fail_after(40):
                async with raw_worker(running.base_url, busy_token) as busy_worker:
                    # Capacity 1: the busy Worker holds one task and asks for nothing more.
                    await busy_worker.hello([busy.queue_id], capacity=1)
                    (conn,) = hub.connections.values()
                    (task,) = (await busy_worker.recv_type("dispatch"))["tasks"]
                    assert task["task_id"] == first
                    ref = [{"task_id": task["task_id"], "token": task["token"]}]
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(blocker.transaction, hold_locks)
                        await locked.wait()
                        async with (
                            raw_worker(running.base_url, staller_tokens[0]) as w0,
                            raw_worker(running.base_url, staller_tokens[1]) as w1,
                            raw_worker(running.base_url, staller_tokens[2]) as w2,
                            raw_worker(running.base_url, staller_tokens[3]) as w3,
                        ):
                            workers = [w0, w1, w2, w3]
                            for w, owner in zip(workers, stallers, strict=True):
                                await w.hello([owner.queue_id])
                            await wait_until(lambda: pool.statistics().in_flight >= 4)
                            # Every claim slot waits on the database; the busy Worker's
                            # transitions do not go through them.
                            with trio.fail_after(5):
                                ack = await busy_worker.request("start", ref, "s")
                                assert ack["results"][0]["ok"] and ack["results"][0]["state"] == "running"
                                ack = await busy_worker.request("renew", ref, "r")
                                assert ack["results"][0]["ok"]
                                finished = [{**ref[0], "outcome": "succeeded", "result": 1}]
                                ack = await busy_worker.request("finish", finished, "f")
                                assert ack["results"][0]["state"] == "succeeded"
                                # Its capacity is free again: its next claim request waits for a slot.
                                await wait_until(lambda: pool.statistics().pending == 1)
                                assert conn.core.outstanding
                                # Drain withdraws it at once, though no slot is free.
                                await busy_worker.send({"type": "drain"})
                                await wait_until(lambda: pool.statistics().pending == 0)
                                assert conn.core.worker_draining and not conn.core.outstanding
                            assert pool.statistics().in_flight == 4  # the stall held throughout
                            done.set()
                            for w in workers:
                                assert len((await w.recv_type("dispatch"))["tasks"]) == 1
        assert (await seed.task_row(db, first))["state"] == "succeeded"
    finally:
        await blocker.aclose()
