"""A finish that frees a resource key wakes the claims waiting on its queue, on this node
and the others: the next task of that key starts at once, not when the queue's cached
empty result expires (the nodes here run a 60 s scan cycle, so waiting for it would be
unmistakable)."""

from __future__ import annotations

import trio

from ..nodeutil import make_tenant
from ..wsclient import raw_worker
from .test_signals import WAKE_BOUND_S, idle_claim_cached, nodes, slow_cycle, submit


async def run_one(worker, task) -> None:
    ref = {"task_id": task["task_id"], "token": task["token"]}
    assert (await worker.request("start", [ref], "s"))["results"][0]["ok"]
    done = {**ref, "outcome": "succeeded", "result": None}
    assert (await worker.request("finish", [done], "f"))["results"][0]["ok"]


async def test_a_freed_key_starts_the_next_task_of_that_key_on_this_node_and_another(node_config, db):
    tenant = await make_tenant(db, "keys")
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        # Waiting on the node whose Worker frees the key, then on another node.
        for holder_node, waiter_node in ((one, one), (one, two)):
            first = await submit(one, tenant, f"a-{waiter_node.base_url}", resource_key="printer")
            second = await submit(one, tenant, f"b-{waiter_node.base_url}", resource_key="printer")
            with trio.fail_after(WAKE_BOUND_S):
                async with raw_worker(holder_node.base_url, tenant.token) as holder:
                    await holder.hello([tenant.queue_id], capacity=1, resource_keys=True)
                    (task,) = (await holder.recv_type("dispatch"))["tasks"]
                    assert task["task_id"] == first
                    async with raw_worker(waiter_node.base_url, tenant.token) as waiter:
                        await waiter.hello([tenant.queue_id], capacity=1, resource_keys=True)
                        # The second task waits for the key: the waiter's claims come back
                        # empty and are cached for the 60 s cycle.
                        await idle_claim_cached(waiter_node)
                        # The holder takes nothing more: only the waiter can run the next task.
                        await holder.send({"type": "drain"})
                        await run_one(holder, task)
                        (task,) = (await waiter.recv_type("dispatch"))["tasks"]
                        assert task["task_id"] == second
                        await run_one(waiter, task)
