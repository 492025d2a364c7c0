"""Worker faults: a connection reset mid-run, a Worker frozen (SIGSTOP) past its lease,
a poison task that kills its Worker process every attempt (real processes, MariaDB, WebSockets)."""

from __future__ import annotations

import json
import subprocess

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed

from harness.proxy import open_fault_proxy
from harness.worker_proc import ProcessSocket, open_worker_process
from orbit_node.domain.ownership import OwnershipLost
from orbit_node.services import default_services
from orbit_sdk.worker import Worker

from .. import seed
from ..checks import assert_attempt_history, tenant_with_token, wait_for_state
from ..helpers import wait_until
from ..nodeutil import run_node
from ..wsclient import RawWorker, raw_worker

FAST_RETRY = {"backoff_initial_ms": 1, "backoff_max_ms": 1}


async def test_reset_mid_run_then_a_frozen_worker_past_its_lease_is_refused(node_config, db):
    """Scenario 2. Attempt 1 runs on a connection that is reset (TCP RST) mid-run: the task
    stays running under its lease, and the Worker, reconnected, cannot finish it. Attempt
    2 runs in a Worker process that is SIGSTOPped past its lease; meanwhile attempt 3 runs
    elsewhere. Resumed, the frozen Worker's renew and finish are refused: exactly one
    terminal state, written by attempt 3."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner, **FAST_RETRY)
    store = seed.lease_store(db)
    async with run_node(node_config, services=default_services()) as node:
        with trio.fail_after(60):
            # Attempt 1: the connection is reset while the task runs.
            async with open_fault_proxy("127.0.0.1", int(node.base_url.rsplit(":", 1)[1])) as ws_proxy:
                async with raw_worker(f"http://127.0.0.1:{ws_proxy.port}", token) as w1:
                    await w1.hello([owner.queue_id])
                    first = (await w1.recv_type("dispatch"))["tasks"][0]
                    ref1 = {"task_id": task_id, "token": first["token"]}
                    assert (await w1.request("start", [ref1], "s1"))["results"][0]["ok"]
                    assert ws_proxy.reset() == 1
                    with pytest.raises(ConnectionClosed):
                        await w1.recv()
            hub = node.node.state.services.hub
            await wait_until(lambda: not hub.connections)
            row = await seed.task_row(db, task_id)
            assert (row["state"], row["fencing_token"], row["attempts"]) == ("running", first["token"], 1)
            async with raw_worker(node.base_url, token) as again:
                await again.hello([owner.queue_id])
                ack = await again.request("finish", [{**ref1, "outcome": "succeeded", "result": 1}], "late")
                assert ack["results"][0] == {"task_id": task_id, "ok": False, "code": "NOT_HELD"}
            assert (await seed.task_row(db, task_id))["state"] == "running"
            # Its lease runs out; the node's sweeper counts a failed attempt and queues it again.
            await seed.expire_lease(db, task_id)
            await wait_for_state(db, task_id, "queued")

            # Attempt 2: a Worker process, frozen while it runs the task.
            frozen_socket = await ProcessSocket.spawn(node.base_url, token)
            try:
                frozen = RawWorker(frozen_socket)
                await frozen.hello([owner.queue_id])
                second = (await frozen.recv_type("dispatch"))["tasks"][0]
                assert second["attempt"] == 2
                ref2 = {"task_id": task_id, "token": second["token"]}
                assert (await frozen.request("start", [ref2], "s2"))["results"][0]["ok"]
                frozen_socket.pause()
                await seed.expire_lease(db, task_id)
                await wait_for_state(db, task_id, "queued")
                # Attempt 3 runs on another connection while the frozen Worker still holds its token.
                async with raw_worker(node.base_url, token) as w3:
                    await w3.hello([owner.queue_id])
                    third = (await w3.recv_type("dispatch"))["tasks"][0]
                    ref3 = {"task_id": task_id, "token": third["token"]}
                    assert (await w3.request("start", [ref3], "s3"))["results"][0]["ok"]
                    frozen_socket.resume()
                    ack = await frozen.request("renew", [ref2], "r2")
                    assert ack["results"][0]["ok"] is False and ack["results"][0]["code"] == "OWNERSHIP_LOST"
                    ack = await frozen.request("finish", [{**ref2, "outcome": "succeeded", "result": 2}], "f2")
                    assert ack["results"][0]["ok"] is False
                    with pytest.raises(OwnershipLost):
                        await store.finish(task_id, second["token"], result_json="2")
                    row = await seed.task_row(db, task_id)
                    assert (row["state"], row["fencing_token"]) == ("running", third["token"])
                    ack = await w3.request("finish", [{**ref3, "outcome": "succeeded", "result": 3}], "f3")
                    assert ack["results"][0]["state"] == "succeeded"
            finally:
                await frozen_socket.aclose()
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"], row["result"]) == ("succeeded", 3, "3")
    history = await assert_attempt_history(db, task_id)
    assert [a["outcome"] for a in history] == ["lease_expired", "lease_expired", "succeeded"]


async def test_a_poison_task_that_kills_its_worker_every_attempt_fails_at_max_attempts(node_config, db):
    """Scenario 8. Each attempt kills the Worker process running it (SIGKILL from the
    handler). Every time, the lease runs out (moved into the past on the database clock)
    and the node's sweeper counts a failed attempt; after max_attempts the task is failed
    and never dispatched again."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner, max_attempts=3, **FAST_RETRY)
    async with run_node(node_config, services=default_services()) as node:
        with trio.fail_after(90):
            for attempt in (1, 2, 3):
                process = await open_worker_process(
                    "poison", node.base_url, token, owner.queue_id, stdout=subprocess.PIPE
                )
                output = b""
                while b"\n" not in output:
                    chunk = await process.stdout.receive_some()
                    assert chunk, "the Worker process ended before running the task"
                    output += chunk
                assert json.loads(output.split(b"\n")[0]) == {"type": "running", "task_id": task_id, "attempt": attempt}
                assert await process.wait() == -9
                row = await wait_for_state(db, task_id, "running")
                assert row["attempts"] == attempt
                await seed.expire_lease(db, task_id)
                row = await wait_for_state(db, task_id, "queued", "failed")
                assert row["state"] == ("failed" if attempt == 3 else "queued")
            # A healthy Worker afterwards gets nothing: the task is settled for good.
            pool = node.node.state.services.pool
            claims: list[str] = []  # outcomes of the claims the node runs from here on
            observe = pool.observe

            def watch(grant, outcome, seconds):
                claims.append(outcome)
                if observe is not None:
                    observe(grant, outcome, seconds)

            pool.observe = watch
            async with raw_worker(node.base_url, token) as w:
                await w.hello([owner.queue_id])
                await wait_until(lambda: claims)  # its claim ran
                assert set(claims) == {"empty"}, claims
                assert not [m for m in w.inbox if m["type"] == "dispatch"]
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"]) == ("failed", 3)
    assert json.loads(row["error"])["code"] == "LEASE_EXPIRED"
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["lease_expired"] * 3


async def test_the_sdk_worker_notices_a_silent_node_and_reconnects(node_config, db):
    """The network to the node goes black (no RST, no FIN): the SDK Worker hears no answer
    to its heartbeats for the heartbeat timeout the node announced, drops the connection
    and reconnects by itself once the node can be reached again; then it runs tasks."""
    owner, token = await tenant_with_token(db)
    config = attrs.evolve(node_config, heartbeat_timeout_s=1.0)
    ran: list[str] = []

    async def handler(task):
        ran.append(task.task_id)
        return "ok"

    async with run_node(config, services=default_services()) as node:
        port = int(node.base_url.rsplit(":", 1)[1])
        async with open_fault_proxy("127.0.0.1", port) as proxy, trio.open_nursery() as nursery:
            worker = Worker(
                url=f"http://127.0.0.1:{proxy.port}", token=token, queues=[owner.queue_id], connect_timeout_s=1.0
            )
            worker.register("h", "v1", "v1", handler)
            with trio.fail_after(30):
                await nursery.start(worker.run)
                proxy.refuse_new = True  # the node is unreachable: new connections fail too
                proxy.blackhole()
                # The Worker gives up on the silent connection and dials again.
                await wait_until(lambda: proxy.accepted >= 2)
                proxy.heal()
                await wait_until(lambda: worker.connections >= 2)
                task_id = await seed.insert_task(db, owner)
                await worker.wait_completed(1)
                assert ran == [task_id]
                await worker.drain()
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["result"]) == ("succeeded", '"ok"')
