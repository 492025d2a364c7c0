"""How a Worker's run ends and what it counted (docs/sdk.md, "Worker"): a refusal is a bare
``WorkerRejected`` whichever way ``run`` is awaited and whatever refused, and the counters
count tasks by how they ended, failed attempts that were retried apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio

from orbit_sdk import (
    Backoff,
    ConfigError,
    OrbitClient,
    OrbitClientError,
    PermanentError,
    Worker,
    WorkerRejected,
    WorkerTask,
)

from ..nodeutil import make_tenant, make_token, task_request

BAD_TOKEN = "orb_" + "0" * 96


def worker_for(url: str, token: str, queues: list[str]) -> Worker:
    worker = Worker(url, token, queues)
    worker.register("h", "v1", "v1", lambda task: None)
    return worker


async def rejection_from_start(worker: Worker) -> WorkerRejected:
    """``except WorkerRejected`` around ``nursery.start(worker.run)``, inside the nursery."""
    async with trio.open_nursery() as nursery:
        try:
            with trio.fail_after(10):
                await nursery.start(worker.run)
        except WorkerRejected as exc:
            return exc
    raise AssertionError("the Worker was not rejected")


async def rejection_from_run(worker: Worker) -> WorkerRejected:
    try:
        with trio.fail_after(10):
            await worker.run()
    except WorkerRejected as exc:
        return exc
    raise AssertionError("the Worker was not rejected")


async def test_every_refusal_is_a_bare_worker_rejected_from_start_and_from_run(full_node, db):
    tenant = await make_tenant(db, queues=("q1",))
    no_connect = await make_token(db, tenant, {"tasks:read": "*"})
    cases = {
        # (token, queues) -> (status, code, field)
        "hello refused: unknown queue": (tenant.token, ["f" * 32], (None, "NOT_FOUND", "queues[0]")),
        "handshake: unknown credential": (BAD_TOKEN, [tenant.queue_id], (401, "UNAUTHENTICATED", "authorization")),
        "handshake: no workers:connect": (no_connect, [tenant.queue_id], (403, "PERMISSION_DENIED", "authorization")),
        # Before: an UnauthenticatedError of the queue-name lookup.
        "lookup: unknown credential with a queue name": (BAD_TOKEN, ["q1"], (401, "UNAUTHENTICATED", "authorization")),
    }
    for name, (token, queues, expected) in cases.items():
        for catch in (rejection_from_start, rejection_from_run):
            error = await catch(worker_for(full_node.base_url, token, queues))
            assert (error.status, error.code, error.field) == expected, (name, catch.__name__, error)
            assert isinstance(error, OrbitClientError) and not hasattr(error, "http_status")
            assert "orb_" not in str(error)
    with pytest.raises(WorkerRejected, match=r"HTTP 401 UNAUTHENTICATED\) looking up queue names"):
        await worker_for(full_node.base_url, BAD_TOKEN, ["q1"]).run()


async def test_a_worker_without_handlers_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        await Worker("http://127.0.0.1:1", BAD_TOKEN, ["f" * 32]).run()
    assert info.value.field == "handlers" and isinstance(info.value, OrbitClientError)


async def test_counters_count_tasks_by_their_end_and_retried_attempts_apart(full_node, db):
    """Before, ``failed`` counted failed attempts: 5 here, for 2 failed tasks."""
    tenant = await make_tenant(db)
    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=4)
    quick = Backoff(initial_ms=10, max_ms=10)

    @worker.handler("h", "v1", "v1")
    async def work(task: WorkerTask):
        kind = task.payload
        if kind == "permanent":
            raise PermanentError("no")
        if kind == "always" or kind == "too-late" or (kind == "flaky" and task.attempt == 1):
            raise ConnectionError(f"attempt {task.attempt}")
        return kind

    later = datetime.now(UTC) + timedelta(seconds=30)
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        submitted = [
            task_request(tenant.queue_id, "ok"),
            task_request(tenant.queue_id, "flaky", max_attempts=3, backoff=quick),
            task_request(tenant.queue_id, "permanent", max_attempts=3),
            task_request(tenant.queue_id, "always", max_attempts=2, backoff=quick),
            # Its retry could not start before its deadline: the failed attempt ends it expired.
            task_request(tenant.queue_id, "too-late", deadline=later, backoff=Backoff(initial_ms=60_000)),
        ]
        ids = [(await client.submit_task(r.payload, r)).task.task_id for r in submitted]
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                await worker.wait_finished(5)
            await worker.drain()
        states = [(await client.get_task(task_id)).state for task_id in ids]
    assert states == ["succeeded", "succeeded", "failed", "failed", "expired"]
    assert (worker.completed, worker.failed) == (2, 2)
    ends = (worker.completed, worker.failed, worker.cancelled, worker.expired, worker.retried, worker.finished)
    assert ends == (2, 2, 0, 1, 2, 5)
