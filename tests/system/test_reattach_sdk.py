"""Running work survives a dropped connection and a node's shutdown: the SDK Worker keeps
its handlers running, reconnects, re-attaches their tasks and reports them there, so each
task runs once, in one attempt (real nodes, MariaDB, WebSockets, a TCP fault proxy)."""

from __future__ import annotations

import collections

import attrs
import pytest
import trio

from harness.proxy import open_fault_proxy
from orbit_node.services import default_services
from orbit_sdk.worker import Worker

from .. import seed
from ..checks import tenant_with_token
from ..helpers import wait_until
from ..nodeutil import run_node

pytestmark = pytest.mark.time_cap(90)

CAPACITY = 8


class Handlers:
    """Handlers that wait for ``go`` once all ``CAPACITY`` of them run: a fault lands
    while every task is in a handler."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.go = trio.Event()

    async def handle(self, task):
        self.runs[task.task_id] += 1
        await self.go.wait()
        return {"ran": task.task_id}

    def all_running(self) -> bool:
        return sum(self.runs.values()) >= CAPACITY


async def each_ran_once_in_one_attempt(db, task_ids, handlers: Handlers) -> None:
    for task_id in task_ids:
        row = await seed.task_row(db, task_id)
        assert (row["state"], row["attempts"]) == ("succeeded", 1), (task_id, row["state"], row["attempts"])
    assert dict(handlers.runs) == dict.fromkeys(task_ids, 1)


async def test_a_dropped_connection_re_attaches_every_running_task(node_config, db):
    owner, token = await tenant_with_token(db)
    handlers = Handlers()
    async with run_node(node_config, services=default_services()) as node:
        port = int(node.base_url.rsplit(":", 1)[1])
        async with open_fault_proxy("127.0.0.1", port) as proxy, trio.open_nursery() as nursery:
            worker = Worker(f"http://127.0.0.1:{proxy.port}", token, [owner.queue_id], capacity=CAPACITY)
            worker.register("h", "v1", "v1", handlers.handle)
            with trio.fail_after(60):
                await nursery.start(worker.run)
                task_ids = [await seed.insert_task(db, owner) for _ in range(CAPACITY)]
                await wait_until(handlers.all_running)
                assert proxy.reset() == 1  # the connection drops (TCP RST) under 8 running handlers
                await wait_until(lambda: worker.connections >= 2)
                handlers.go.set()
                await worker.wait_completed(CAPACITY)
                await worker.drain()
    await each_ran_once_in_one_attempt(db, task_ids, handlers)


async def test_a_node_shutting_down_moves_its_workers_and_their_running_tasks_to_another(node_config, db):
    owner, token = await tenant_with_token(db)
    handlers = Handlers()
    async with (
        run_node(node_config, services=default_services()) as first,
        run_node(node_config, services=default_services()) as second,
        trio.open_nursery() as nursery,
    ):
        worker = Worker([first.base_url, second.base_url], token, [owner.queue_id], capacity=CAPACITY)
        worker.register("h", "v1", "v1", handlers.handle)
        with trio.fail_after(60):
            await nursery.start(worker.run)
            assert worker.url == first.base_url
            task_ids = [await seed.insert_task(db, owner) for _ in range(CAPACITY)]
            await wait_until(handlers.all_running)
            first.node.request_shutdown()  # a rolling restart: SIGTERM to the Worker's node
            await wait_until(lambda: worker.connections >= 2)
            assert worker.url == second.base_url
            handlers.go.set()
            await worker.wait_completed(CAPACITY)
            await worker.drain()
    await each_ran_once_in_one_attempt(db, task_ids, handlers)
    rows = [await seed.task_row(db, task_id) for task_id in task_ids]
    assert {row["owner_node_id"] for row in rows} == {second.node.node_id}


async def test_a_task_whose_lease_ran_out_while_no_node_answered_is_stopped_and_not_reported(node_config, db):
    owner, token = await tenant_with_token(db)
    handlers = Handlers()
    stopped: list[str] = []

    async def handle(task):
        try:
            return await handlers.handle(task)
        except trio.Cancelled:
            stopped.append(task.task_id)
            raise

    config = attrs.evolve(node_config, run_lease_s=2.0)
    async with run_node(config, services=default_services()) as node:
        port = int(node.base_url.rsplit(":", 1)[1])
        async with open_fault_proxy("127.0.0.1", port) as proxy, trio.open_nursery() as nursery:
            worker = Worker(
                f"http://127.0.0.1:{proxy.port}", token, [owner.queue_id], capacity=1, connect_timeout_s=0.5
            )
            worker.register("h", "v1", "v1", handle)
            with trio.fail_after(60):
                await nursery.start(worker.run)
                task_id = await seed.insert_task(db, owner)
                await wait_until(lambda: handlers.runs[task_id] == 1)
                proxy.refuse_new = True
                proxy.reset()
                # No node can be reached for longer than the run lease: the handler stops.
                await wait_until(lambda: stopped == [task_id])
                proxy.refuse_new = False
                await wait_until(lambda: worker.connections >= 2)
                nursery.cancel_scope.cancel()
    assert worker.completed == 0
