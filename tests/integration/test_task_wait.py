"""``GET /v1/tasks/{id}?wait_s=N`` through real nodes on one database (docs/api.md,
"Waiting for a task"): the answer comes as soon as the task finishes, through whichever
node, or at the end of the wait with the task as it is; a bad ``wait_s`` is refused
naming it; a waiting request holds no turn of its application and no access-log line;
the node's shutdown answers it at once.

The waiting nodes' own check of the states (``dispatch/waits.py``, once a second) is set
to a minute where a test shows that a signal, or the node's own finish, woke the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import httpx
import pytest
import trio

from orbit_node.config import AdmissionLimits, NodeConfig
from orbit_node.services import default_services
from orbit_sdk import Worker, WorkerTask

from ..helpers import wait_until
from ..nodeutil import RunningNode, Tenant, assert_error, make_tenant, run_node

# A wake-up must come within this (the machine may be busy); far below the check's minute.
WAKE_BOUND_S = 10.0


@asynccontextmanager
async def nodes(config: NodeConfig, count: int) -> AsyncIterator[list[RunningNode]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(run_node(config, services=default_services())) for _ in range(count)]


def no_own_check(node: RunningNode) -> None:
    """Only a signal, or a finish through this node, can end its requests' waits in time."""
    node.node.state.services.shards.main.waits.check_interval_s = 60.0


def waits(node: RunningNode):
    return node.node.state.services.shards.main.waits


def relay(node: RunningNode):
    signals = node.node.state.services.shards.main.signals
    assert signals is not None
    return signals


async def submit(node: RunningNode, tenant: Tenant, key: str, **extra) -> str:
    body = {"queue_id": tenant.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1"} | extra
    async with node.client(tenant.token) as http:
        accepted = await http.post("/v1/tasks", json={"payload": {}} | body, headers={"Idempotency-Key": key})
    assert accepted.status_code == 201, accepted.text
    return accepted.json()["data"]["task_id"]


async def state_of(db, task_id: str, state: str) -> bool:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT state FROM tasks WHERE task_id = %s", (task_id,)))
    return rows[0]["state"] == state


async def timed_get(node: RunningNode, tenant: Tenant, task_id: str, **params) -> tuple[httpx.Response, float]:
    async with node.client(tenant.token) as http:
        began = trio.current_time()
        answer = await http.get(f"/v1/tasks/{task_id}", params=params, timeout=60)
        return answer, trio.current_time() - began


async def running_task(
    nursery: trio.Nursery, db, tenant: Tenant, worker_node: RunningNode, release: trio.Event
) -> tuple[Worker, str]:
    """A Worker of ``worker_node`` running a task (submitted through that node) until ``release``."""
    worker = Worker(worker_node.base_url, tenant.token, [tenant.queue_id], capacity=2)

    @worker.handler("h", "v1", "v1")
    async def hold(task: WorkerTask) -> dict:
        await release.wait()
        return {"done": task.task_id}

    await nursery.start(worker.run)
    task_id = await submit(worker_node, tenant, "k")
    await wait_until(lambda: state_of(db, task_id, "running"))
    return worker, task_id


async def test_a_wait_answers_as_soon_as_its_task_finishes_on_another_node(node_config, db):
    tenant = await make_tenant(db, "cross")
    release = trio.Event()
    async with nodes(node_config, 2) as (working, waiting):
        no_own_check(waiting)
        async with trio.open_nursery() as nursery:
            worker, task_id = await running_task(nursery, db, tenant, working, release)
            heard_before = relay(working).statistics().heard

            async def finish_once_watched() -> None:
                # The working node has heard that a request waits for the task: its
                # Finish is written as a signal (the other way round is test_signal_core's).
                await wait_until(lambda: relay(working).statistics().heard > heard_before)
                await trio.sleep(0.2)
                release.set()

            nursery.start_soon(finish_once_watched)
            with trio.fail_after(WAKE_BOUND_S):
                answer, took = await timed_get(waiting, tenant, task_id, wait_s="30")
            await worker.drain()
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert (data["state"], data["result"]) == ("succeeded", {"done": task_id})
    assert took < WAKE_BOUND_S
    assert relay(waiting).statistics().finished_heard == 1
    assert waits(waiting).statistics() == {"waiting": 0, "woken": 1, "timed_out": 0, "checks": 0}


async def test_a_wait_answers_as_soon_as_its_task_finishes_on_the_same_node(node_config, db):
    tenant = await make_tenant(db, "local")
    release = trio.Event()
    async with nodes(node_config, 1) as (node,):
        no_own_check(node)
        async with trio.open_nursery() as nursery:
            worker, task_id = await running_task(nursery, db, tenant, node, release)

            async def finish_soon() -> None:
                await wait_until(lambda: waits(node).waiting_requests == 1)
                release.set()

            nursery.start_soon(finish_soon)
            with trio.fail_after(WAKE_BOUND_S):
                answer, _ = await timed_get(node, tenant, task_id, wait_s="30")
            await worker.drain()
    assert answer.status_code == 200 and answer.json()["data"]["state"] == "succeeded", answer.text
    assert waits(node).woken == 1


async def test_a_cancel_through_a_node_without_workers_wakes_a_wait_on_another(node_config, db):
    """The cancelling node reads no signals (no Worker, no waiting request), so it knows no
    watch: it writes the finish of what it cancels for whoever may wait."""
    tenant = await make_tenant(db, "cancel")
    async with nodes(node_config, 2) as (cancelling, waiting):
        no_own_check(waiting)
        task_id = await submit(cancelling, tenant, "k", delay_s=3600)
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await wait_until(lambda: waits(waiting).waiting_requests == 1)
                async with cancelling.client(tenant.token) as http:
                    assert (await http.post(f"/v1/tasks/{task_id}/cancel")).status_code == 200

            nursery.start_soon(cancel_soon)
            with trio.fail_after(WAKE_BOUND_S):
                answer, _ = await timed_get(waiting, tenant, task_id, wait_s="30")
    assert answer.status_code == 200 and answer.json()["data"]["state"] == "cancelled", answer.text


async def test_the_nodes_own_check_finds_a_finish_no_signal_told(node_config, db):
    """A task finished behind the nodes' backs (``orbit-admin``, a node of an older
    version): the waiting node's once-a-second read of the states finds it."""
    tenant = await make_tenant(db, "behind")
    async with nodes(node_config, 1) as (node,):
        task_id = await submit(node, tenant, "k", delay_s=3600)
        async with trio.open_nursery() as nursery:

            async def finish_behind_its_back() -> None:
                await wait_until(lambda: waits(node).waiting_requests == 1)
                await db.run(
                    lambda tx: tx.execute_raw(
                        "UPDATE tasks SET state = 'cancelled', finished_at = NOW(6) WHERE task_id = %s", (task_id,)
                    )
                )

            nursery.start_soon(finish_behind_its_back)
            with trio.fail_after(WAKE_BOUND_S):
                answer, _ = await timed_get(node, tenant, task_id, wait_s="30")
    assert answer.json()["data"]["state"] == "cancelled", answer.text
    assert waits(node).checks >= 1


async def test_a_wait_ends_after_wait_s_with_the_task_as_it_is_and_a_finished_task_answers_at_once(full_node, db):
    tenant = await make_tenant(db, "timeout")
    queued = await submit(full_node, tenant, "queued", delay_s=3600)
    answer, took = await timed_get(full_node, tenant, queued, wait_s="1.5")
    assert answer.status_code == 200 and answer.json()["data"]["state"] == "queued", answer.text
    assert 1.5 <= took < 1.5 + WAKE_BOUND_S
    done = await submit(full_node, tenant, "done", delay_s=3600)
    async with full_node.client(tenant.token) as http:
        assert (await http.post(f"/v1/tasks/{done}/cancel")).status_code == 200
    answer, took = await timed_get(full_node, tenant, done, wait_s="30")
    assert answer.json()["data"]["state"] == "cancelled" and took < 5
    # wait_s=0 is a plain read.
    answer, took = await timed_get(full_node, tenant, queued, wait_s="0")
    assert answer.json()["data"]["state"] == "queued" and took < 5
    assert waits(full_node).statistics()["timed_out"] == 1


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("wait_s=31", "wait_s"),
        ("wait_s=30.001", "wait_s"),
        ("wait_s=-1", "wait_s"),
        ("wait_s=abc", "wait_s"),
        ("wait_s=", "wait_s"),
        ("wait_s=1e1", "wait_s"),
        ("wait_s=1.2345", "wait_s"),
        ("wait_s=1&wait_s=2", "wait_s"),
        ("wait=5", "wait"),
    ],
)
async def test_a_bad_wait_is_refused_naming_the_field(running_node, db, query, field):
    tenant = await make_tenant(db, "bad")
    async with running_node.client(tenant.token) as http:
        answer = await http.get(f"/v1/tasks/{'0' * 32}?{query}")
    assert_error(answer, 400, "INVALID_ARGUMENT", field)


async def test_a_waiting_request_holds_no_turn_and_no_access_log_line(dsn, db, caplog):
    """One admission slot: another request of the same application is served while one
    waits. The access log (``errors``, the default) says nothing of a wait longer than its
    slow threshold, and the HTTP metric counts the request without its wait."""
    config = NodeConfig(
        dsn=dsn,
        http_host="127.0.0.1",
        http_port=0,
        shutdown_grace_s=2.0,
        admission=AdmissionLimits(slots=1, per_application=1, reserve=0),
    )
    tenant = await make_tenant(db, "turns")
    caplog.set_level(logging.INFO, logger="orbit.access")
    async with run_node(config, services=default_services()) as node:
        waited = await submit(node, tenant, "waited", delay_s=3600)
        other = await submit(node, tenant, "other", delay_s=3600)
        async with trio.open_nursery() as nursery:
            answers: dict[str, tuple[httpx.Response, float]] = {}

            async def get(name: str, task_id: str, wait_s: str = "0") -> None:
                answers[name] = await timed_get(node, tenant, task_id, wait_s=wait_s)

            nursery.start_soon(get, "waited", waited, "2")
            await wait_until(lambda: waits(node).waiting_requests == 1)
            with trio.fail_after(WAKE_BOUND_S):
                await get("other", other)
            assert "waited" not in answers
        registry = node.node.state.metrics.registry
        seconds = registry.get_sample_value(
            "orbit_http_request_duration_seconds_sum", {"method": "GET", "route": "/v1/tasks/<task_id>"}
        )
    assert answers["other"][0].status_code == 200 and answers["other"][1] < 2.0
    assert answers["waited"][0].status_code == 200 and answers["waited"][1] >= 2.0
    assert [r.getMessage() for r in caplog.records if r.name == "orbit.access" and r.levelno >= logging.INFO] == []
    assert seconds is not None and seconds < 2.0


async def test_shutdown_answers_a_waiting_request_at_once(node_config, db):
    tenant = await make_tenant(db, "shutdown")
    config = attrs.evolve(node_config, shutdown_grace_s=20.0)
    async with nodes(config, 1) as (node,):
        task_id = await submit(node, tenant, "k", delay_s=3600)
        async with trio.open_nursery() as nursery:
            got: list[tuple[httpx.Response, float]] = []

            async def get() -> None:
                got.append(await timed_get(node, tenant, task_id, wait_s="30"))

            nursery.start_soon(get)
            await wait_until(lambda: waits(node).waiting_requests == 1)
            node.node.request_shutdown()
    [(answer, took)] = got
    assert answer.status_code == 200 and answer.json()["data"]["state"] == "queued", answer.text
    assert took < 10
