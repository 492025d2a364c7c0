"""depends_on end to end: an SDK producer and an SDK Worker against a node with every
service, over real WebSockets and MariaDB."""

from __future__ import annotations

import pytest
import trio

from orbit_node.services import default_services
from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

from ..nodeutil import make_tenant, run_node

WIDE = 1000


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


def request(queue_id: str, handler: str, **extra) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler=handler, handler_version="v1", payload_version="v1", payload={}, **extra
    )


@pytest.mark.time_cap(240)
async def test_a_thousand_wide_fan_out_and_its_fan_in_child_run_in_order(full_node, db):
    tenant = await make_tenant(db)
    entered: dict[str, float] = {}
    finished: set[str] = set()

    async def part(task: WorkerTask) -> int:
        entered[task.task_id] = trio.current_time()
        finished.add(task.task_id)
        return 1

    async def join(task: WorkerTask) -> int:
        entered[task.task_id] = trio.current_time()
        return len(finished)

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        parts = [(f"part-{n}", request(tenant.queue_id, "part")) for n in range(WIDE)]
        accepted = await client.submit_many(parts, return_tasks=False)
        assert all(item.created for item in accepted)
        # The fan-in names all 1,000 by their keys, in a request of its own.
        joined = await client.submit_task(
            "join", request(tenant.queue_id, "join", depends_on_keys=[key for key, _ in parts])
        )
        assert joined.task.state == "waiting" and len(joined.task.depends_on) == WIDE
        again = await client.submit_task(
            "join", request(tenant.queue_id, "join", depends_on_keys=[key for key, _ in parts])
        )
        assert not again.created and again.task.task_id == joined.task.task_id
        worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=64)
        worker.register("part", "v1", "v1", part)
        worker.register("join", "v1", "v1", join)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(180):
                await worker.wait_finished(WIDE + 1)
            await worker.drain()
            nursery.cancel_scope.cancel()
        done = await client.get_task(joined.task.task_id)
        assert (done.state, done.result) == ("succeeded", WIDE)
        part_ids = [item.task_id for item in accepted]
        assert entered[joined.task.task_id] >= max(entered[t] for t in part_ids)
        page = await client.list_children(part_ids[0])
        assert [(c.task_id, c.state) for c in page.items] == [(joined.task.task_id, "succeeded")]


async def test_a_fan_in_whose_part_fails_is_cancelled_with_the_part_named(full_node, db):
    tenant = await make_tenant(db)

    async def part(task: WorkerTask) -> None:
        if task.payload.get("fail"):
            raise RuntimeError("no")

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        good = ("good", request(tenant.queue_id, "part"))
        bad = (
            "bad",
            SubmitTaskRequest(
                queue_id=tenant.queue_id,
                handler="part",
                handler_version="v1",
                payload_version="v1",
                payload={"fail": True},
                max_attempts=1,
            ),
        )
        fan = await client.submit_fan_in([good, bad], ("join", request(tenant.queue_id, "join")))
        assert fan.join.state == "waiting"
        worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=4)
        worker.register("part", "v1", "v1", part)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(60):
                await worker.wait_finished(2)
                while (await client.get_task(fan.join.task_id)).state == "waiting":
                    await trio.sleep(0.1)
            await worker.drain()
            nursery.cancel_scope.cancel()
        join = await client.get_task(fan.join.task_id)
        assert join.state == "cancelled"
        assert join.error["code"] == "DEPENDENCY_FAILED"
        assert join.error["parent_task_id"] == fan.parts[1].task_id


async def test_a_child_reads_its_parents_results_through_the_worker(full_node, db):
    tenant = await make_tenant(db)
    seen: dict[str, tuple] = {}

    async def part(task: WorkerTask) -> dict:
        return {"n": task.payload["n"], "big": 2**80 + task.payload["n"]}

    async def join(task: WorkerTask) -> int:
        parents = await task.parents()
        seen["ids"] = task.parent_ids
        seen["parents"] = tuple(p.task_id for p in parents)
        return sum(p.result["big"] for p in parents)

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        parts = [
            (
                f"p{n}",
                SubmitTaskRequest(
                    queue_id=tenant.queue_id,
                    handler="part",
                    handler_version="v1",
                    payload_version="v1",
                    payload={"n": n},
                ),
            )
            for n in range(3)
        ]
        fan = await client.submit_fan_in(parts, ("join", request(tenant.queue_id, "join")))
        worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=4)
        worker.register("part", "v1", "v1", part)
        worker.register("join", "v1", "v1", join)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(60):
                await worker.wait_finished(4)
            await worker.drain()
            nursery.cancel_scope.cancel()
        done = await client.get_task(fan.join.task_id)
        assert done.result == 3 * 2**80 + 3
        assert seen["ids"] == seen["parents"] == tuple(sorted(p.task_id for p in fan.parts))
