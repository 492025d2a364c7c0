"""A producer waits for its tasks (docs/sdk.md, "Waiting for tasks"): ``OrbitClient.wait``
returns them once terminal, asking the node to wait for each (``wait_s``), ``as_finished``
yields them as they end, a timeout is a ``WaitTimeoutError`` naming what did not finish,
and a node that does not wait is polled with the documented back-off."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import trio

from orbit_sdk import (
    Backoff,
    InvalidRequestError,
    NotFoundError,
    OrbitClient,
    OrbitClientError,
    PermanentError,
    WaitTimeoutError,
    Worker,
    WorkerTask,
    waiting,
)

from ..nodeutil import make_tenant, task_request


async def submit(client: OrbitClient, queue_id: str, payloads, **extra) -> list[str]:
    return [
        (await client.submit_task(f"k-{payload}", task_request(queue_id, payload, **extra))).task.task_id
        for payload in payloads
    ]


async def test_wait_returns_every_task_in_a_terminal_state_in_the_order_asked(full_node, db):
    tenant = await make_tenant(db)
    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=4)

    @worker.handler("h", "v1", "v1")
    async def work(task: WorkerTask):
        if task.payload == "bad":
            raise PermanentError("no")
        await trio.sleep(0.2)
        return {"echo": task.payload}

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        ids = await submit(client, tenant.queue_id, ["a", "bad", "c"], max_attempts=1)
        cancelled = (await submit(client, tenant.queue_id, ["later"], delay_s=3600))[0]
        await client.cancel_task(cancelled)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                tasks = await client.wait([ids[2], cancelled, ids[0], ids[1], ids[0]], timeout_s=15)
            await worker.drain()
    assert [t.task_id for t in tasks] == [ids[2], cancelled, ids[0], ids[1]]
    assert [t.state for t in tasks] == ["succeeded", "cancelled", "succeeded", "failed"]
    assert tasks[0].result == {"echo": "c"} and tasks[3].error["message"] == "PermanentError: no"
    assert all(t.finished_at is not None for t in tasks)
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        assert await client.wait([]) == []


async def test_as_finished_yields_each_task_when_it_ends(full_node, db):
    tenant = await make_tenant(db)
    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=2)
    release = trio.Event()

    @worker.handler("h", "v1", "v1")
    async def work(task: WorkerTask):
        if task.payload == "slow":
            await release.wait()
        return task.payload

    seen = []
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        slow, fast = await submit(client, tenant.queue_id, ["slow", "fast"])
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                async for task in client.as_finished([slow, fast], timeout_s=15):
                    seen.append((task.task_id, task.result))
                    release.set()  # the slow one ends only after the fast one was yielded
            await worker.drain()
    assert seen == [(fast, "fast"), (slow, "slow")]


async def test_a_timeout_names_the_unfinished_tasks(full_node, db):
    """No Worker serves ``nobody``: the wait ends after its timeout with the tasks still
    queued named (and the finished one kept), as a client error."""
    tenant = await make_tenant(db)
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        done = (await submit(client, tenant.queue_id, ["done"], delay_s=3600))[0]
        await client.cancel_task(done)
        stuck = [
            (await client.submit_task(f"stuck-{i}", task_request(tenant.queue_id, i, handler="nobody"))).task.task_id
            for i in range(2)
        ]
        started = trio.current_time()
        with trio.fail_after(10), pytest.raises(WaitTimeoutError) as info:
            await client.wait([done, *stuck], timeout_s=1.0)
        waited = trio.current_time() - started
    error = info.value
    assert isinstance(error, OrbitClientError) and error.code == "WAIT_TIMEOUT" and not hasattr(error, "http_status")
    assert error.unfinished == {stuck[0]: "queued", stuck[1]: "queued"}
    assert [t.task_id for t in error.finished] == [done]
    assert str(error) == f"2 of 3 tasks not finished within 1 s: {stuck[0]} (queued), {stuck[1]} (queued)"
    assert 1.0 <= waited < 3.0


async def test_bad_ids_are_refused_before_polling_and_an_unknown_id_at_once(full_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        with pytest.raises(InvalidRequestError) as info:
            await client.wait("0" * 32)
        assert info.value.field == "task_ids"
        with pytest.raises(InvalidRequestError) as info:
            await client.wait(["0" * 32, "not-an-id"])
        assert info.value.field == "task_ids[1]"
        with pytest.raises(InvalidRequestError) as info:
            await client.wait(["0" * 32], timeout_s=-1)
        assert info.value.field == "timeout_s"
        with trio.fail_after(5), pytest.raises(NotFoundError) as info:
            await client.wait(["0" * 32], timeout_s=60)
        assert info.value.field == "task_id"
        for wait_s in (31, -1, True, "5", float("nan")):
            with pytest.raises(InvalidRequestError) as info:
                await client.get_task("0" * 32, wait_s=wait_s)
            assert info.value.field == "wait_s"


async def test_the_sdk_wait_sends_one_request_per_task_while_it_runs(full_node, db):
    """A task that takes 2 s: one held request (polling would have sent 5)."""
    tenant = await make_tenant(db, "sdk")
    requests: list[str] = []

    async def count(request: httpx.Request) -> None:
        if request.method == "GET":
            requests.append(str(request.url.query, "ascii"))

    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=1)

    @worker.handler("h", "v1", "v1")
    async def slow(task: WorkerTask) -> str:
        await trio.sleep(2.0)
        return "done"

    async with OrbitClient(full_node.base_url, tenant.token, event_hooks={"request": [count]}) as client:
        accepted = await client.submit_task("k", task_request(tenant.queue_id, 1))
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(10):
                [task] = await client.wait([accepted.task.task_id], timeout_s=60)
            await worker.drain()
    assert (task.state, task.result) == ("succeeded", "done")
    assert requests == ["wait_s=30"]


def test_the_pause_between_rounds_doubles_to_two_seconds():
    pauses = [pause for pause, _ in zip(waiting.pauses(), range(8), strict=False)]
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]


async def test_polling_cost_follows_the_documented_schedule(autojump_clock):
    """One GET per unfinished task per round; rounds at 0, 0.1, 0.3, 0.7, 1.5, 3.1 s, then
    every 2 s; a 503 or an unreachable node is ridden out; the timeout is the cause's."""
    task_ids = ["a" * 32, "b" * 32]
    reads: list[tuple[float, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        task_id = request.url.path.rsplit("/", 1)[1]
        now = trio.current_time()
        reads.append((now, task_id))
        if task_id == task_ids[0] and now > 1.0:
            state = "succeeded"
        elif 2.0 < now < 4.0:
            return httpx.Response(503, json={"error": {"code": "UNAVAILABLE", "message": "db", "field": None}})
        else:
            state = "running"
        return httpx.Response(200, content=json.dumps({"data": task_json(task_id, state)}))

    async with OrbitClient("http://node.test", "t", transport=httpx.MockTransport(handler)) as client:
        start = trio.current_time()
        with pytest.raises(WaitTimeoutError) as info:
            await client.wait(task_ids, timeout_s=10)
    times = sorted({round(t - start, 3) for t, _ in reads})
    assert times == [0.0, 0.1, 0.3, 0.7, 1.5, 3.1, 5.1, 7.1, 9.1]
    # a: read until it was seen succeeded (at 1.5 s); b: every round.
    assert sum(1 for _, task_id in reads if task_id == task_ids[0]) == 5
    assert sum(1 for _, task_id in reads if task_id == task_ids[1]) == len(times)
    assert info.value.unfinished == {task_ids[1]: "running"}
    assert math.isclose(trio.current_time() - start, 10.0)


async def test_a_node_that_waits_costs_a_request_per_task_per_wait(autojump_clock):
    """``wait`` asks the node to wait (``wait_s``, 30 s at most, ending 0.5 s before the
    caller's timeout); a node that holds each read until its task ends or the wait is up
    is asked again at once. ``as_finished`` asks it for its last unfinished task only."""
    task_ids = ["a" * 32, "b" * 32]
    ends = {task_ids[0]: 45.0, task_ids[1]: 10.0}
    reads: list[tuple[float, str, str | None]] = []

    async def holding(request: httpx.Request) -> httpx.Response:
        task_id = request.url.path.rsplit("/", 1)[1]
        wait_s = request.url.params.get("wait_s")
        now = trio.current_time()
        reads.append((round(now, 3), task_id[0], wait_s))
        if wait_s is not None and now < ends[task_id]:
            await trio.sleep(min(float(wait_s), ends[task_id] - now))
        state = "succeeded" if trio.current_time() >= ends[task_id] else "running"
        return httpx.Response(200, content=json.dumps({"data": task_json(task_id, state)}))

    async with OrbitClient("http://node.test", "t", transport=httpx.MockTransport(holding)) as client:
        tasks = await client.wait(task_ids, timeout_s=100)
        assert [t.state for t in tasks] == ["succeeded", "succeeded"]
        assert sorted(reads) == [(0.0, "a", "30"), (0.0, "b", "30"), (30.0, "a", "30")]
        reads.clear()
        start = trio.current_time()
        ends.update({task_ids[0]: start + 5.0, task_ids[1]: start + 1.0})
        seen = [task.task_id[0] async for task in client.as_finished(task_ids, timeout_s=20)]
    # Two unfinished: polled (0, 0.1, 0.3, 0.7, 1.5 s: b ends); then a alone, asked to wait
    # up to 0.5 s before the timeout, answered when it ends (5 s).
    assert seen == ["b", "a"]
    assert [(round(t - start, 3), name, w) for t, name, w in reads if name == "a"] == [
        (0.0, "a", None),
        (0.1, "a", None),
        (0.3, "a", None),
        (0.7, "a", None),
        (1.5, "a", None),
        (3.1, "a", "16.4"),
    ]
    assert math.isclose(trio.current_time() - start, 5.0)


async def test_a_node_that_refuses_wait_s_is_polled(autojump_clock):
    reads: list[tuple[float, str | None]] = []

    def refusing(request: httpx.Request) -> httpx.Response:
        wait_s = request.url.params.get("wait_s")
        reads.append((trio.current_time(), wait_s))
        if wait_s is not None:
            error = {"code": "INVALID_ARGUMENT", "message": "wait_s: unknown query parameter", "field": "wait_s"}
            return httpx.Response(400, json={"error": error, "request_id": "req_1"})
        state = "succeeded" if trio.current_time() >= 1.0 else "running"
        return httpx.Response(200, content=json.dumps({"data": task_json("a" * 32, state)}))

    async with OrbitClient("http://node.test", "t", transport=httpx.MockTransport(refusing)) as client:
        start = trio.current_time()
        [task] = await client.wait(["a" * 32], timeout_s=10)
    assert task.state == "succeeded"
    assert [(round(t - start, 3), w) for t, w in reads] == [
        (0.0, "9.5"),
        (0.1, None),
        (0.3, None),
        (0.7, None),
        (1.5, None),
    ]


async def test_a_failure_that_outlasts_the_wait_is_its_cause(autojump_clock):
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with OrbitClient("http://node.test", "t", transport=httpx.MockTransport(down)) as client:
        with pytest.raises(WaitTimeoutError) as info:
            await client.wait(["a" * 32], timeout_s=5)
    assert info.value.unfinished == {"a" * 32: None}
    assert "a" * 32 + " (not read)" in str(info.value)
    assert type(info.value.__cause__).__name__ == "TransportError"


def task_json(task_id: str, state: str) -> dict:
    return {
        "task_id": task_id,
        "queue_id": "c" * 32,
        "handler": "h",
        "handler_version": "v1",
        "payload_version": "v1",
        "state": state,
        "attempts": 1,
        "max_attempts": 3,
        "available_at": "2030-01-01T00:00:00Z",
        "deadline": None,
        "resource_key": None,
        "cancel_requested": False,
        "created_at": "2030-01-01T00:00:00Z",
        "finished_at": "2030-01-01T00:00:01Z" if state == "succeeded" else None,
        "payload": None,
        "backoff": Backoff(initial_ms=1000, max_ms=300000, multiplier=2.0).to_json(),
        "reserved_at": None,
        "started_at": None,
        "updated_at": "2030-01-01T00:00:00Z",
        "plan_id": None,
        "plan_version": None,
    }
