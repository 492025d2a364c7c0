"""A retry, a resumed queue and a raised queue control reach the waiting Workers of every
node at once, whether they were asked through another node's API or through orbit-admin
(no node at all).

As in tests/integration/test_signals.py the nodes run a 60 s scan cycle: a cached empty claim result
holds a waiting Worker for a minute, so a dispatch within the bound can only come from a
signal."""

from __future__ import annotations

import functools

import trio

from ..helpers import cli, wait_until
from ..nodeutil import make_tenant
from ..seed import TaskSpec, insert_tasks
from ..wsclient import raw_worker
from .test_api_tasks import set_columns
from .test_signals import WAKE_BOUND_S, idle_claim_cached, nodes, relay, slow_cycle, submit

# Each test waits for two wakes and runs orbit-admin once (a process that starts slowly
# on a busy machine): well under the 60 s scan cycle a lost signal would wait for.
BOUND_S = 4 * WAKE_BOUND_S


def silent_worker_config(node_config):
    """The slow scan cycle, and a heartbeat timeout beyond BOUND_S: the raw Worker of these
    tests sends nothing after its hello, and on a busy machine (orbit-admin starting
    slowly) a test may run past the default 30 s and be closed for its silence."""
    return slow_cycle(node_config, heartbeat_timeout_s=2 * BOUND_S)


async def admin(dsn, *args: str):
    result = await trio.to_thread.run_sync(functools.partial(cli, "orbit-admin", *args, dsn=dsn))
    assert result.returncode == 0, result.stderr
    return result


def claims_empty(node) -> int:
    return node.node.state.services.pool.statistics().claims_empty


async def emptied(node, before: int) -> None:
    """The node's waiting Worker claimed again and found nothing it may take (cached now)."""
    await wait_until(lambda: claims_empty(node) > before)


async def waiting_again(node) -> None:
    """After a dispatch that took fewer tasks than asked, the Worker's next request waits
    on the empty-result cache (no SQL until a signal or the cycle's end)."""
    await wait_until(lambda: node.node.state.services.pool.statistics().pending == 1)


async def failed_task(one, tenant, db, key: str) -> str:
    task_id = await submit(one, tenant, key)
    await set_columns(db, task_id, "state = 'failed', finished_at = NOW(6)")
    return task_id


async def test_a_retry_wakes_the_waiting_worker_of_another_node(node_config, db, dsn):
    tenant = await make_tenant(db, "retry")
    async with nodes(silent_worker_config(node_config), 2) as (one, two):
        by_api = await failed_task(one, tenant, db, "a")
        by_admin = await failed_task(one, tenant, db, "b")
        with trio.fail_after(BOUND_S):
            async with raw_worker(two.base_url, tenant.token) as w:
                await w.hello([tenant.queue_id], capacity=2)
                await idle_claim_cached(two)
                async with one.client(tenant.token) as http:
                    retry = (await http.post(f"/v1/tasks/{by_api}/retry")).json()["data"]
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == retry["task_id"]

                woken = relay(two).statistics().woken
                await waiting_again(two)
                await admin(dsn, "task", "retry", by_admin)
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                rows = await db.run(
                    lambda tx: tx.fetchall_raw("SELECT retried_from FROM tasks WHERE task_id = %s", (task["task_id"],))
                )
                assert rows[0]["retried_from"] == by_admin
    assert relay(two).statistics().woken > woken


async def test_resuming_a_queue_wakes_the_waiting_worker_of_another_node(node_config, db, dsn):
    tenant = await make_tenant(db, "resume")
    async with nodes(silent_worker_config(node_config), 2) as (one, two):
        async with one.client(tenant.token) as http:
            await http.post(f"/v1/queues/{tenant.queue_id}/pause")
        first = await submit(one, tenant, "a")
        with trio.fail_after(BOUND_S):
            async with raw_worker(two.base_url, tenant.token) as w:
                await w.hello([tenant.queue_id], capacity=2)
                # The queue is paused: its claims come back empty and are cached.
                await idle_claim_cached(two)
                async with one.client(tenant.token) as http:
                    await http.post(f"/v1/queues/{tenant.queue_id}/resume")
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == first
                await waiting_again(two)

                empty = claims_empty(two)
                async with one.client(tenant.token) as http:
                    await http.post(f"/v1/queues/{tenant.queue_id}/pause")
                second = await submit(one, tenant, "b")
                # The claim the arrival woke found the queue paused.
                await emptied(two, empty)
                await admin(dsn, "queue", "resume", tenant.queue_id)
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == second


async def test_raising_max_running_per_key_wakes_the_waiting_worker_of_another_node(node_config, db, dsn):
    tenant = await make_tenant(db, "per-key")
    async with nodes(silent_worker_config(node_config), 2) as (one, two):
        # Written straight into the database: no arrival signal, so a dispatch after the
        # first can only come from the control's.
        first, second, third = await insert_tasks(
            db, tenant, [TaskSpec(available_in_s=-10 + i, resource_key="k") for i in range(3)]
        )
        with trio.fail_after(BOUND_S):
            async with raw_worker(two.base_url, tenant.token) as w:
                await w.hello([tenant.queue_id], capacity=8, resource_keys=True)
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == first
                # One task of a key at a time: the claim took fewer than it asked for, so the
                # Worker's next request waits on the cached result.
                await waiting_again(two)
                async with one.client(tenant.token) as http:
                    response = await http.patch(
                        f"/v1/queues/{tenant.queue_id}/controls", json={"max_running_per_key": 2}
                    )
                    assert response.status_code == 200, response.text
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == second
                await waiting_again(two)
                await admin(dsn, "queue", "controls", tenant.queue_id, "--max-running-per-key", "3")
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == third
