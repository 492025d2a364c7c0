"""The SDK client against a real node over HTTP: priority on the wire, exact integers,
idempotent submission, typed errors, queues, and the credentials file of orbit-admin."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import attrs
import httpx
import pytest
import trio

from orbit_node.cli.admin import bootstrap
from orbit_sdk import (
    AlreadyExistsError,
    Backoff,
    ConfigError,
    Credentials,
    FailedPreconditionError,
    IdempotencyConflictError,
    InvalidArgumentError,
    NotFoundError,
    OrbitClient,
    PermissionDeniedError,
    SubmitTaskRequest,
    TransportError,
    UnauthenticatedError,
)

from ..nodeutil import make_tenant, make_token


class Wire:
    """Captures the JSON bodies exchanged, through httpx event hooks."""

    def __init__(self):
        self.requests: list[tuple[str, str, bytes]] = []
        self.responses: list[bytes] = []

    async def on_request(self, request: httpx.Request):
        self.requests.append((request.method, request.url.path, request.content))

    async def on_response(self, response: httpx.Response):
        self.responses.append(await response.aread())

    def hooks(self) -> dict:
        return {"request": [self.on_request], "response": [self.on_response]}


@pytest.fixture
async def credentials_file(running_node, db, tmp_path):
    path = tmp_path / "orbit.credentials.json"
    await bootstrap(
        db,
        application="priority-example",
        namespace="default",
        environment="test",
        queues=["initial"],
        worker_access=True,
        output=path,
        url=running_node.base_url,
    )
    return path


def request(queue_id: str, **fields) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id,
        handler="object.prepare",
        handler_version="v1",
        payload_version="v1",
        payload={"object_ref": "objects/example"},
        **fields,
    )


async def test_priority_9_returns_priority_9_and_0_is_never_on_the_wire(running_node, credentials_file):
    wire = Wire()
    env = {"ORBIT_URL": running_node.base_url, "ORBIT_CREDENTIALS_FILE": str(credentials_file)}
    credentials = Credentials.load(credentials_file)
    queue_id = credentials.queues["initial"]
    async with OrbitClient.from_env(env, event_hooks=wire.hooks()) as client:
        high = await client.submit_task("prepare-operation-009", request(queue_id, priority=9))
        assert high.created is True and high.task.priority == 9
        assert json.loads(wire.requests[-1][2])["priority"] == 9
        assert json.loads(wire.responses[-1])["data"]["priority"] == 9

        normal = await client.submit_task("prepare-operation-000", request(queue_id, priority=0))
        sent = json.loads(wire.requests[-1][2])
        assert "priority" not in sent and sent["queue_id"] == queue_id
        assert "priority" not in json.loads(wire.responses[-1])["data"]
        assert normal.task.priority == 0

        fetched = await client.get_task(normal.task.task_id)
        assert "priority" not in json.loads(wire.responses[-1])["data"] and fetched.priority == 0
        assert (await client.get_task(high.task.task_id)).priority == 9


async def test_big_integers_round_trip_exactly(running_node, db):
    tenant = await make_tenant(db)
    payload = {"big": 2**200 + 1, "negative": -(10**50) - 7, "list": [10**30, 1.25, None, "x"]}
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        accepted = await client.submit_task("big", attrs.evolve(request(tenant.queue_id), payload=payload))
        assert accepted.task.payload == payload
        fetched = await client.get_task(accepted.task.task_id)
    assert fetched.payload == payload
    assert fetched.payload["big"] == 2**200 + 1 and type(fetched.payload["big"]) is int


async def test_submit_is_idempotent_and_conflicts_are_typed(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        first = await client.submit_task("k", request(tenant.queue_id, priority=4))
        repeat = await client.submit_task("k", request(tenant.queue_id, priority=4))
        assert (first.created, repeat.created) == (True, False)
        assert repeat.task == first.task
        with pytest.raises(IdempotencyConflictError) as info:
            await client.submit_task("k", request(tenant.queue_id, priority=5))
    error = info.value
    assert (error.status, error.code, error.field) == (409, "IDEMPOTENCY_CONFLICT", "Idempotency-Key")
    assert error.request_id.startswith("req_") and error.request_id in str(error)


async def test_all_submission_fields_reach_the_server(running_node, db):
    tenant = await make_tenant(db)
    available = datetime(2030, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        accepted = await client.submit_task(
            "full",
            request(
                tenant.queue_id,
                priority=3,
                available_at=available,
                deadline=available + timedelta(hours=1),
                max_attempts=5,
                backoff=Backoff(initial_ms=500, multiplier=3.0),
                resource_key="objects/example",
            ),
        )
        delayed = await client.submit_task("delayed", request(tenant.queue_id, delay_s=60))
    task = accepted.task
    assert task.available_at == available and task.deadline == available + timedelta(hours=1)
    assert (task.max_attempts, task.resource_key, task.priority) == (5, "objects/example", 3)
    assert task.backoff == Backoff(initial_ms=500, max_ms=300000, multiplier=3.0)
    assert delayed.task.available_at > delayed.task.created_at + timedelta(seconds=59)
    with pytest.raises(ValueError):
        request(tenant.queue_id, available_at=datetime(2030, 1, 1))  # naive: refused before sending


async def test_server_errors_carry_code_field_and_request_id(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        with pytest.raises(InvalidArgumentError) as info:
            await client.submit_task("bad", request(tenant.queue_id, priority=10))
        assert (info.value.status, info.value.code, info.value.field) == (400, "INVALID_ARGUMENT", "priority")
        with pytest.raises(NotFoundError) as info:
            await client.get_task("0" * 32)
        assert info.value.field == "task_id"
        # An id is always one path segment, whatever it contains: never another route.
        with pytest.raises(NotFoundError):
            await client.get_task("../queues")
        with pytest.raises(InvalidArgumentError) as info:
            await client.get_task("not-an-id")
        assert info.value.field == "task_id"
    async with OrbitClient(running_node.base_url, "orb_" + "0" * 96) as client:
        with pytest.raises(UnauthenticatedError) as info:
            await client.list_tasks()
        assert info.value.code == "UNAUTHENTICATED"
    read_only = await make_token(db, tenant, {"tasks:read": "*"})
    async with OrbitClient(running_node.base_url, read_only) as client:
        with pytest.raises(PermissionDeniedError):
            await client.submit_task("denied", request(tenant.queue_id))


async def test_unreachable_node_is_a_transport_error():
    async with OrbitClient("http://127.0.0.1:1", "orb_" + "0" * 96) as client:
        with trio.fail_after(10), pytest.raises(TransportError):
            await client.list_queues()


async def test_list_and_cancel_tasks(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        ids = [(await client.submit_task(f"k{i}", request(tenant.queue_id, priority=i))).task.task_id for i in range(3)]
        page = await client.list_tasks(queue_id=tenant.queue_id, limit=2)
        rest = await client.list_tasks(queue_id=tenant.queue_id, limit=2, cursor=page.next_cursor)
        assert [t.task_id for t in page.items + rest.items] == sorted(ids, reverse=True)
        assert rest.next_cursor is None
        assert [t.priority for t in page.items + rest.items] == [2, 1, 0]
        cancelled = await client.cancel_task(ids[0])
        assert cancelled.state == "cancelled" and cancelled.finished_at is not None
        assert [t.task_id for t in (await client.list_tasks(state="cancelled")).items] == [ids[0]]
        await client.submit_task("done", request(tenant.queue_id))
        done_id = (await client.list_tasks(limit=1)).items[0].task_id
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id = %s", (done_id,)))
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        with pytest.raises(FailedPreconditionError):
            await client.cancel_task(done_id)


async def test_queue_management(running_node, db):
    tenant = await make_tenant(db)
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        queue = await client.create_queue("priority-example-1", max_concurrency=1)
        assert queue.max_concurrency == 1 and queue.max_starts_per_second is None and not queue.paused
        with pytest.raises(AlreadyExistsError) as info:
            await client.create_queue("priority-example-1")
        assert info.value.field == "name"
        assert (await client.pause_queue(queue.queue_id)).paused is True
        assert (await client.get_queue(queue.queue_id)).paused is True
        assert (await client.resume_queue(queue.queue_id)).paused is False
        changed = await client.set_queue_controls(queue.queue_id, max_starts_per_second=5)
        assert (changed.max_concurrency, changed.max_starts_per_second) == (1, 5)
        unlimited = await client.set_queue_controls(queue.queue_id, max_concurrency=None)
        assert (unlimited.max_concurrency, unlimited.max_starts_per_second) == (None, 5)
        assert unlimited.max_running_per_key == 1
        per_key = await client.set_queue_controls(queue.queue_id, max_running_per_key=3)
        assert (per_key.max_concurrency, per_key.max_starts_per_second, per_key.max_running_per_key) == (None, 5, 3)
        with pytest.raises(InvalidArgumentError) as refused:
            await client.set_queue_controls(queue.queue_id, max_running_per_key=0)
        assert refused.value.field == "max_running_per_key"
        first = await client.list_queues(limit=1)
        second = await client.list_queues(limit=1, cursor=first.next_cursor)
        assert {q.queue_id for q in first.items + second.items} == {tenant.queue_id, queue.queue_id}
        assert second.next_cursor is None
        exports = await client.create_queue("exports", max_running_per_key=4)
        assert (await client.get_queue(exports.queue_id)).max_running_per_key == 4


def test_credentials_file_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="ORBIT_CREDENTIALS_FILE is not set"):
        OrbitClient.from_env({})
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError, match="cannot be read"):
        Credentials.load(missing)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"url": "http://x", "token": "t"}))
    with pytest.raises(ConfigError, match="missing 'application'"):
        Credentials.load(partial)
    partial.write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        Credentials.load(partial)


async def test_sdk_submit_many_round_trip(running_node, db):
    tenant = await make_tenant(db)
    q = tenant.queue_id
    pairs = [(f"sdk-{i}", request(q, priority=i % 10, delay_s=1.5)) for i in range(25)]
    pairs.append(("sdk-bad", request(q, priority=10)))
    pairs.append(("sdk-3", request(q, priority=4)))  # sdk-3 was sent with priority 3
    pairs.append(("sdk-missing", request("e" * 32)))
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        got = await client.submit_many(pairs, batch_size=10)
        assert len(got) == 28
        assert all(r.created and r.accepted for r in got[:25])
        assert [r.task.priority for r in got[:25] if r.task] == [i % 10 for i in range(25)]
        assert got[0].task is not None and got[0].task.payload == {"object_ref": "objects/example"}
        assert got[0].task.available_at - got[0].task.created_at == timedelta(seconds=1.5)
        assert isinstance(got[25].error, InvalidArgumentError) and got[25].error.field == "tasks[5].priority"
        assert isinstance(got[26].error, IdempotencyConflictError) and got[26].status == 409
        assert got[26].error.field == "tasks[6].idempotency_key" and got[26].error.request_id.startswith("req_")
        assert isinstance(got[27].error, NotFoundError) and not got[27].accepted

        again = await client.submit_many(pairs[:25])
        assert [r.status for r in again] == [200] * 25
        assert [r.task for r in again] == [r.task for r in got[:25]]
        fetched = await client.get_task(got[7].task.task_id)  # type: ignore[union-attr]
        assert fetched == got[7].task
        assert [(r.task_id, r.state) for r in got[:3]] == [(r.task.task_id, "queued") for r in got[:3] if r.task]

        # Ids and states only: the same acceptance, a lighter answer.
        light = await client.submit_many(pairs[:3] + [("sdk-new", request(q))], return_tasks=False)
        assert [r.status for r in light] == [200, 200, 200, 201]
        assert all(r.task is None and r.state == "queued" for r in light)
        assert [r.task_id for r in light[:3]] == [r.task.task_id for r in got[:3] if r.task]
