"""What wakes a waiting claim on a real node (real WebSockets, real MariaDB), and the
fairness group of an application across its namespaces.

The node runs with a 60 s scan cycle, so a cached empty result would hold a waiting
Worker for a minute: a dispatch within a few seconds can only come from a wake-up."""

from __future__ import annotations

import pytest
import trio

from orbit_node.db import Database
from orbit_node.services import default_services
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..helpers import application_rows_locked, wait_until
from ..nodeutil import ALL_SCOPES, run_node
from ..wsclient import raw_worker
from .test_signals import slow_cycle

# The whole wake-up must happen within this (the machine may be busy).
WAKE_BOUND_S = 10.0


@pytest.fixture
async def slow_cycle_node(node_config):
    config = slow_cycle(node_config)
    async with run_node(config, services=default_services()) as running:
        yield running


async def token_for(db: Database, owner: seed.Tenant) -> str:
    _, token = await TenancyStore(db).create_credential(owner.namespace_id, "t", ALL_SCOPES)
    return token


async def test_a_task_accepted_through_the_api_wakes_its_waiting_worker(slow_cycle_node, db):
    owner = await seed.tenant(db)
    token = await token_for(db, owner)
    pool = slow_cycle_node.node.state.services.pool
    with trio.fail_after(WAKE_BOUND_S):
        async with raw_worker(slow_cycle_node.base_url, token) as w:
            await w.hello([owner.queue_id])
            # The first probe found nothing: the queue is cached empty for the cycle.
            await wait_until(lambda: pool.statistics().claims_empty >= 1 and pool.statistics().pending == 1)
            async with slow_cycle_node.client(token) as http:
                accepted = await http.post(
                    "/v1/tasks",
                    json={
                        "queue_id": owner.queue_id,
                        "handler": "h",
                        "handler_version": "v1",
                        "payload_version": "v1",
                        "payload": {},
                    },
                    headers={"Idempotency-Key": "wake"},
                )
                assert accepted.status_code == 201, accepted.text
            (task,) = (await w.recv_type("dispatch"))["tasks"]
            assert task["task_id"] == accepted.json()["data"]["task_id"]


async def test_a_released_task_wakes_the_workers_waiting_for_its_queue(slow_cycle_node, db):
    owner = await seed.tenant(db)
    task_id = await seed.insert_task(db, owner)
    token = await token_for(db, owner)
    pool = slow_cycle_node.node.state.services.pool
    with trio.fail_after(WAKE_BOUND_S):
        async with raw_worker(slow_cycle_node.base_url, token) as holder:
            await holder.hello([owner.queue_id])
            (task,) = (await holder.recv_type("dispatch"))["tasks"]
            async with raw_worker(slow_cycle_node.base_url, token) as waiter:
                await waiter.hello([owner.queue_id])
                # The holder (capacity 1, full) asks for nothing; the waiter found the queue empty.
                await wait_until(lambda: pool.statistics().claims_empty >= 1 and pool.statistics().pending == 1)
                ack = await holder.request("release", [{"task_id": task_id, "token": task["token"]}], "r")
                assert ack["results"][0]["ok"]
                # Either waiting connection may take it; neither waits for the cycle.
                with trio.move_on_after(WAKE_BOUND_S / 2):
                    (again,) = (await waiter.recv_type("dispatch"))["tasks"]
                    assert again["task_id"] == task_id
                    return
                (again,) = (await holder.recv_type("dispatch"))["tasks"]
                assert again["task_id"] == task_id


async def test_two_namespaces_of_one_application_share_one_fairness_group(slow_cycle_node, db, dsn):
    """The rotation's unit is the application: connections of its two namespaces wait behind
    one in-flight claim, and the application counts its turns as one."""
    first = await seed.tenant(db, application="shared", namespace="one")
    second = await seed.tenant(db, application="shared", namespace="two")
    assert first.application_id == second.application_id and first.namespace_id != second.namespace_id
    await TenancyStore(db).set_application_quota(
        first.application_id, max_concurrent_executions=10, max_starts_per_second=None
    )
    for owner in (first, second):
        await seed.insert_task(db, owner)
    tokens = [await token_for(db, first), await token_for(db, second)]
    pool = slow_cycle_node.node.state.services.pool
    with trio.fail_after(30):
        async with (
            raw_worker(slow_cycle_node.base_url, tokens[0]) as w1,
            raw_worker(slow_cycle_node.base_url, tokens[1]) as w2,
        ):
            # Claims of the application lock its row (quota): the first claim stays in flight.
            async with application_rows_locked(dsn, [first.application_id]):
                await w1.hello([first.queue_id])
                await w2.hello([second.queue_id])
                await wait_until(lambda: pool.statistics().in_flight + pool.statistics().pending == 2)
                # Two free SQL slots, yet one claim runs: the namespaces share the limit of one.
                assert (pool.statistics().in_flight, pool.statistics().pending) == (1, 1)
            for w in (w1, w2):
                assert len((await w.recv_type("dispatch"))["tasks"]) == 1
    turns = pool.statistics().turns_by_application
    assert list(turns) == [first.application_id] and turns[first.application_id] == 2
