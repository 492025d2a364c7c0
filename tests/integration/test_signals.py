"""Signals between nodes on a real MariaDB (real nodes, real WebSockets): what a node
accepts, requeues or is asked to cancel reaches the Workers of every other node.

The nodes run with a 60 s scan cycle, so a cached empty result would hold a waiting
Worker for a minute: a dispatch within a few seconds can only come from a signal (or a
due time). The tests that lose signals run a 1 s cycle instead and show that the cycle
still delivers."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import pytest
import trio

from orbit_node.config import NodeConfig
from orbit_node.db import Database
from orbit_node.services import default_services

from ..helpers import wait_until
from ..nodeutil import RunningNode, Tenant, make_tenant, run_node
from ..wsclient import raw_worker

# Far longer than any bound below: only a signal can end the wait.
SCAN_CYCLE_S = 60.0
# The whole wake-up must happen within this (the machine may be busy).
WAKE_BOUND_S = 10.0


def slow_cycle(config: NodeConfig, scan_cycle_s: float = SCAN_CYCLE_S, **changes) -> NodeConfig:
    """A scan cycle of ``scan_cycle_s``: an empty claim result stays cached that long. The
    per-connection pace keeps its rate per second (P3's 4 claims in a 1 s cycle): counted
    per 60 s cycle, 4 claims would let a fifth wake wait for the next cycle, and how many
    claims a test's Worker makes before it waits (a signal heard twice, a look-back) is
    the machine's timing, not what these tests check."""
    scheduler = config.scheduler
    per_cycle = max(
        scheduler.claims_per_connection_per_cycle, math.ceil(scheduler.claims_per_connection_per_cycle * scan_cycle_s)
    )
    limits = attrs.evolve(scheduler, scan_cycle_s=scan_cycle_s, claims_per_connection_per_cycle=per_cycle)
    return attrs.evolve(config, scheduler=limits, **changes)


@asynccontextmanager
async def nodes(config: NodeConfig, count: int) -> AsyncIterator[list[RunningNode]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(run_node(config, services=default_services())) for _ in range(count)]


def task_body(queue: str, **extra) -> dict:
    return {"queue_id": queue, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {}} | extra


async def submit(node: RunningNode, tenant: Tenant, key: str, **extra) -> str:
    body = task_body(tenant.queue_id) | extra
    async with node.client(tenant.token) as http:
        accepted = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
    assert accepted.status_code == 201, accepted.text
    return accepted.json()["data"]["task_id"]


async def idle_claim_cached(node: RunningNode, waiting: int = 1) -> None:
    """The node's waiting Workers found their queues empty: the empty results are cached."""
    pool = node.node.state.services.pool
    await wait_until(lambda: pool.statistics().claims_empty >= waiting and pool.statistics().pending == waiting)


def relay(node: RunningNode):
    return node.node.state.services.shards.main.signals


async def test_a_task_accepted_through_another_node_wakes_the_waiting_worker(node_config, db):
    tenant = await make_tenant(db, "cross")
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        with trio.fail_after(WAKE_BOUND_S):
            async with raw_worker(two.base_url, tenant.token) as w:
                await w.hello([tenant.queue_id])
                await idle_claim_cached(two)
                task_id = await submit(one, tenant, "k")
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == task_id
    assert relay(two).statistics().woken >= 1
    # What operators see of it.
    assert metric(one, "orbit_signals_total", event="written") >= 1
    assert metric(two, "orbit_signals_total", event="heard") >= 1
    assert metric(two, "orbit_signals_total", event="queue_woken") >= 1
    assert metric(two, "orbit_signal_reads_total", outcome="ok") >= 1
    assert metric(two, "orbit_signal_reads_total", outcome="failed") == 0


def metric(node: RunningNode, name: str, **labels: str) -> float:
    found = node.node.state.metrics.registry.get_sample_value(name, labels)
    assert found is not None, name
    return found


async def test_a_batch_accepted_through_another_node_wakes_the_workers_of_each_queue(node_config, db):
    tenant = await make_tenant(db, "batch", queues=("a", "b"))
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        with trio.fail_after(WAKE_BOUND_S):
            async with raw_worker(two.base_url, tenant.token) as wa, raw_worker(two.base_url, tenant.token) as wb:
                await wa.hello([tenant.queues["a"]])
                await wb.hello([tenant.queues["b"]])
                await idle_claim_cached(two, waiting=2)
                items = [
                    {"idempotency_key": f"{name}{n}", **task_body(tenant.queues[name])}
                    for n, name in enumerate(("a", "b", "a"))
                ]
                async with one.client(tenant.token) as http:
                    answer = await http.post("/v1/tasks/batch", json={"tasks": items})
                assert answer.status_code == 200 and answer.json()["data"]["created"] == 3, answer.text
                got_a = len((await wa.recv_type("dispatch"))["tasks"])
                got_b = len((await wb.recv_type("dispatch"))["tasks"])
                assert got_b == 1 and got_a in (1, 2)


async def test_a_release_on_one_node_wakes_the_workers_waiting_on_another(node_config, db):
    tenant = await make_tenant(db, "release")
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        task_id = await submit(one, tenant, "k")
        with trio.fail_after(WAKE_BOUND_S):
            async with raw_worker(one.base_url, tenant.token) as holder:
                await holder.hello([tenant.queue_id])
                (task,) = (await holder.recv_type("dispatch"))["tasks"]
                async with raw_worker(two.base_url, tenant.token) as waiter:
                    await waiter.hello([tenant.queue_id])
                    await idle_claim_cached(two)
                    # The holder drains: it asks for no more, so only the other node's
                    # Worker can take the task back.
                    await holder.send({"type": "drain"})
                    ack = await holder.request("release", [{"task_id": task_id, "token": task["token"]}], "r")
                    assert ack["results"][0]["ok"]
                    (again,) = (await waiter.recv_type("dispatch"))["tasks"]
                    assert again["task_id"] == task_id
    assert relay(two).statistics().woken >= 1


async def test_a_delayed_task_wakes_the_workers_of_every_node_at_its_due_time(node_config, db):
    tenant = await make_tenant(db, "delayed")
    delay_s = 1.5
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        with trio.fail_after(WAKE_BOUND_S):
            async with raw_worker(one.base_url, tenant.token) as w1, raw_worker(two.base_url, tenant.token) as w2:
                await w1.hello([tenant.queue_id])
                await w2.hello([tenant.queue_id])
                await idle_claim_cached(one)
                await idle_claim_cached(two)
                submitted = trio.current_time()
                task_ids = {await submit(one, tenant, f"k{n}", delay_s=delay_s) for n in range(2)}
                got = [t["task_id"] for w in (w1, w2) for t in (await w.recv_type("dispatch"))["tasks"]]
                assert trio.current_time() - submitted >= delay_s - 0.05
    assert sorted(got) == sorted(task_ids)
    # The accepting node set its own timer; the other heard the due time from the table.
    assert relay(one).statistics().due == 0
    assert relay(two).statistics().due >= 1


async def test_a_retry_wakes_its_queue_when_its_backoff_ends(node_config, db):
    tenant = await make_tenant(db, "retry")
    async with nodes(slow_cycle(node_config), 2) as (one, two):
        task_id = await submit(one, tenant, "k", backoff={"initial_ms": 1000, "max_ms": 1000, "multiplier": 1.0})
        with trio.fail_after(WAKE_BOUND_S):
            async with raw_worker(one.base_url, tenant.token) as first:
                await first.hello([tenant.queue_id])
                (task,) = (await first.recv_type("dispatch"))["tasks"]
                ref = {"task_id": task_id, "token": task["token"]}
                assert (await first.request("start", [ref], "s"))["results"][0]["ok"]
                async with raw_worker(two.base_url, tenant.token) as second:
                    await second.hello([tenant.queue_id])
                    await idle_claim_cached(two)
                    await first.send({"type": "drain"})
                    failed = {**ref, "outcome": "failed", "retryable": True, "error": {"message": "again"}}
                    done = await first.request("finish", [failed], "f")
                    assert done["results"][0]["state"] == "queued"
                    (again,) = (await second.recv_type("dispatch"))["tasks"]
                    assert again["task_id"] == task_id
    assert relay(two).statistics().due >= 1


async def test_many_nodes_and_one_down_each_worker_hears_its_queue(node_config, db):
    tenant = await make_tenant(db, "many", queues=("a", "b", "c"))
    async with nodes(slow_cycle(node_config), 3) as (one, two, three):
        async with run_node(slow_cycle(node_config), services=default_services()) as gone:
            pass  # a peer that registered and stopped: nothing waits for it
        assert gone.node.state.services.shards.main.signals is not None
        workers: list = []
        with trio.fail_after(WAKE_BOUND_S * 2):
            async with AsyncExitStack() as stack:
                for node, name in ((two, "b"), (three, "c"), (one, "a")):
                    w = await stack.enter_async_context(raw_worker(node.base_url, tenant.token))
                    await w.hello([tenant.queues[name]])
                    workers.append((w, name))
                for node in (one, two, three):
                    await idle_claim_cached(node)
                ids = {name: await submit(one, tenant, name, queue_id=tenant.queues[name]) for name in "abc"}
                for w, name in workers:
                    (task,) = (await w.recv_type("dispatch"))["tasks"]
                    assert task["task_id"] == ids[name]


async def rename(db: Database, old: str, new: str) -> None:
    await db.run(lambda tx: tx.execute_raw(f"RENAME TABLE `{old}` TO `{new}`"))


async def test_lost_signals_cost_one_scan_cycle_and_signals_resume(node_config, db):
    """While the signal table can be neither written nor read, a task accepted through
    another node is still dispatched (the waiting claim's empty result expires after the
    1 s cycle); once the table is back, the other node hears signals again."""
    tenant = await make_tenant(db, "lost")
    async with nodes(slow_cycle(node_config, 1.0), 2) as (one, two):
        with trio.fail_after(WAKE_BOUND_S * 2):
            async with raw_worker(two.base_url, tenant.token) as w:
                # Capacity 2: holding one task, the Worker still asks for the next.
                await w.hello([tenant.queue_id], capacity=2)
                await idle_claim_cached(two)
                await rename(db, "node_signals", "node_signals_away")
                failed_reads = relay(two).statistics().read_failures
                await wait_until(lambda: relay(two).statistics().read_failures > failed_reads)
                lost = await submit(one, tenant, "lost")
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == lost
                await wait_until(lambda: relay(one).statistics().publish_failures >= 1)
                assert relay(two).statistics().woken == 0
                await rename(db, "node_signals_away", "node_signals")
                reads = relay(two).statistics().reads
                await wait_until(lambda: relay(two).statistics().reads > reads)
                heard = await submit(one, tenant, "heard")
                (task,) = (await w.recv_type("dispatch"))["tasks"]
                assert task["task_id"] == heard
                await wait_until(lambda: relay(two).statistics().woken >= 1)


async def test_signals_are_pruned_after_they_are_kept(node_config, db):
    tenant = await make_tenant(db, "prune")
    timing = attrs.evolve(node_config.signals, keep_s=1, prune_interval_s=0.2)
    async with nodes(attrs.evolve(node_config, signals=timing), 1) as (one,):
        await submit(one, tenant, "k")
        rows = await wait_until(lambda: count_signals(db), timeout_s=5)
        assert rows >= 1
        await wait_until(lambda: _none(count_signals(db)), timeout_s=10)
    assert relay(one).statistics().pruned >= 1


async def count_signals(db: Database) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM node_signals"))
    return int(rows[0]["n"])


async def _none(count) -> bool:
    return await count == 0


@pytest.mark.parametrize("listening", [False, True])
async def test_a_node_reads_signals_only_while_it_has_worker_connections(node_config, db, listening):
    tenant = await make_tenant(db, "quiet")
    async with nodes(node_config, 1) as (one,):
        signals = relay(one)
        if listening:
            async with raw_worker(one.base_url, tenant.token) as w:
                await w.hello([tenant.queue_id])
                await wait_until(lambda: signals.statistics().reads >= 2)
        else:
            for _ in range(3):
                await signals.wait_for_read()
            assert signals.statistics().reads == 0
