"""OrbitClient's retry, bulk cancel and retry (one call and following the cursor), and
filtered listings, against a real node over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orbit_sdk import (
    FailedPreconditionError,
    InvalidArgumentError,
    OrbitClient,
    SubmitTaskRequest,
    TaskFilter,
)

from ..nodeutil import make_tenant
from .test_api_tasks import set_columns


def request(queue_id: str, **fields) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler="h", handler_version="v1", payload_version="v1", payload={}, **fields
    )


async def test_retry_a_task_and_find_tasks_by_filter(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        tasks = [(await client.submit_task(f"k{i}", request(tenant.queue_id, priority=i))).task for i in range(6)]
        await set_columns(db, tasks[0].task_id, "state = 'failed', finished_at = NOW(6)")
        with pytest.raises(FailedPreconditionError) as refused:
            await client.retry_task(tasks[1].task_id)
        assert refused.value.field == "task_id"
        first = await client.retry_task(tasks[0].task_id)
        again = await client.retry_task(tasks[0].task_id)
        assert first.created and not again.created and first.task.task_id == again.task.task_id
        assert first.task.retried_from == tasks[0].task_id and first.task.priority == 0

        failed = await client.list_tasks(filter=TaskFilter(states=["failed"]))
        assert [t.task_id for t in failed.items] == [tasks[0].task_id] and failed.next_cursor is None
        high = await client.list_tasks(state=["queued"], filter=TaskFilter(priority_min=3, priorities=[1, 3, 5]))
        assert [t.priority for t in high.items] == [5, 3]
        assert {t.waiting_reason for t in high.items} == {"NO_CAPABLE_WORKER"}
        since = datetime.now(UTC) - timedelta(hours=1)
        every = [t.task_id async for t in client.iter_tasks(TaskFilter(created_after=since), page_size=2)]
        assert every == [first.task.task_id, *(t.task_id for t in reversed(tasks))]
        with pytest.raises(InvalidArgumentError) as bad:
            await client.list_tasks(filter=TaskFilter(states=["done"]))
        assert bad.value.field == "state"
        with pytest.raises(ValueError):
            TaskFilter(created_after=datetime(2030, 1, 1)).to_json()


async def test_bulk_cancel_and_retry_follow_the_cursor(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        tasks = [(await client.submit_task(f"k{i}", request(tenant.queue_id))).task for i in range(5)]
        done = (await client.submit_task("done", request(tenant.queue_id))).task
        await set_columns(db, done.task_id, "state = 'succeeded', finished_at = NOW(6)")

        one = await client.bulk_cancel(TaskFilter(task_ids=[tasks[0].task_id, done.task_id]))
        assert (one.changed, one.refused, one.next_cursor) == (1, 1, None)
        refusal = next(item for item in one.items if item.outcome == "refused")
        assert isinstance(refusal.error, FailedPreconditionError) and refusal.task_id == done.task_id

        results = [r async for r in client.iter_bulk_cancel(TaskFilter(queue_id=tenant.queue_id), limit=2)]
        assert [r.changed for r in results] == [2, 2] and results[-1].next_cursor is None
        retried = [r async for r in client.iter_bulk_retry(TaskFilter(queue_id=tenant.queue_id), limit=3)]
        assert [r.changed for r in retried] == [3, 2]
        items = [item for r in retried for item in r.items]
        assert [i.task_id for i in items] == [t.task_id for t in reversed(tasks)]
        assert all(i.outcome == "retried" and i.retry_task_id for i in items)
        again = await client.bulk_retry(TaskFilter(queue_id=tenant.queue_id, states=["cancelled"]))
        assert (again.changed, again.unchanged) == (0, 5)
        with pytest.raises(InvalidArgumentError) as bad:
            await client.bulk_retry(TaskFilter())
        assert bad.value.field == "filter"
