"""The SDK Worker batches its transitions: every Start and Finish ready in one tick (or
while the previous message of its kind awaits its ack) goes to the node in one message."""

from __future__ import annotations

import trio

from orbit_node.services import default_services
from orbit_sdk.client import OrbitClient
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from ..nodeutil import make_tenant, run_node

TASKS = 32
CAPACITY = 16


async def test_finishes_ready_together_travel_in_one_message(node_config, db):
    tenant = await make_tenant(db, "batch")
    async with run_node(node_config, services=default_services()) as node:
        async with OrbitClient(node.base_url, tenant.token) as client:
            for i in range(TASKS):
                await client.submit_task(
                    f"k{i}",
                    SubmitTaskRequest(
                        queue_id=tenant.queue_id,
                        handler="h",
                        handler_version="v1",
                        payload_version="v1",
                        payload={"i": i},
                    ),
                )
            worker = Worker(url=node.base_url, token=tenant.token, queues=[tenant.queue_id], capacity=CAPACITY)
            running = 0
            gate = trio.Event()

            @worker.handler("h", "v1", "v1")
            async def handle(task: WorkerTask):
                nonlocal running, gate
                running += 1
                if running == CAPACITY:
                    # Every slot is busy: release them all at once, so their finishes are
                    # ready in the same tick.
                    running, released = 0, gate
                    gate = trio.Event()
                    released.set()
                else:
                    await gate.wait()
                return task.payload

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    await worker.wait_completed(TASKS)
                    await worker.drain()
            page = await client.list_tasks(queue_id=tenant.queue_id, state="succeeded", limit=100)
            assert len(page.items) == TASKS
    # One finish per task would be 32 messages; released together, 16 tasks share one.
    assert worker.messages_sent["finish"] <= TASKS // CAPACITY + 2
    assert worker.messages_sent["start"] < TASKS
