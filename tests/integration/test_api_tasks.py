"""Tasks over real HTTP: what acceptance stores, detail, summaries and pagination, cancel."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from ..nodeutil import assert_error, make_tenant

TASK = {"handler": "object.prepare", "handler_version": "v1", "payload_version": "v1", "payload": {"n": 1}}
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT)


async def db_now(db) -> datetime:
    return (await db.fetchone("db_now"))["now"]


async def task_row(db, task_id: str) -> dict:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM tasks WHERE task_id = %s", (task_id,)))
    return rows[0]


async def set_columns(db, task_id: str, assignments: str, *params) -> None:
    """Play the dispatch side: move a task's row directly (the API never writes these columns)."""
    await db.run(lambda tx: tx.execute_raw(f"UPDATE tasks SET {assignments} WHERE task_id = %s", (*params, task_id)))


async def submit(client, queue_id: str, key: str, **fields):
    response = await client.post(
        "/v1/tasks", json={**TASK, "queue_id": queue_id, **fields}, headers={"Idempotency-Key": key}
    )
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_accepted_task_detail(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        before = await db_now(db)
        task = await submit(client, tenant.queue_id, "k")
        after = await db_now(db)
    assert set(task) == {
        "task_id",
        "queue_id",
        "handler",
        "handler_version",
        "payload_version",
        "state",
        "attempts",
        "max_attempts",
        "available_at",
        "deadline",
        "resource_key",
        "cancel_requested",
        "created_at",
        "finished_at",
        "payload",
        "backoff",
        "reserved_at",
        "started_at",
        "updated_at",
        "plan_id",
        "plan_version",
        "retried_from",
    }
    assert len(task["task_id"]) == 32 and task["queue_id"] == tenant.queue_id
    assert (task["handler"], task["handler_version"], task["payload_version"]) == ("object.prepare", "v1", "v1")
    assert task["state"] == "queued" and task["attempts"] == 0 and task["max_attempts"] == 3
    assert task["backoff"] == {"initial_ms": 1000, "max_ms": 300000, "multiplier": 2.0}
    assert task["payload"] == {"n": 1} and task["cancel_requested"] is False
    assert task["deadline"] is None and task["resource_key"] is None and task["finished_at"] is None
    # Without available_at the task is due at once, on the database clock.
    assert before <= parse_time(task["available_at"]) <= after
    row = await task_row(db, task["task_id"])
    assert row["application_id"] == tenant.application_id and row["namespace_id"] == tenant.namespace_id
    assert row["priority"] == 0 and row["dispatch_at"] == row["available_at"]


async def test_priority_is_stored_and_shown_only_when_non_zero(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        high = await submit(client, tenant.queue_id, "high", priority=9)
        normal = await submit(client, tenant.queue_id, "normal", priority=0)
        absent = await submit(client, tenant.queue_id, "absent")
        assert high["priority"] == 9
        assert "priority" not in normal and "priority" not in absent
        detail = (await client.get(f"/v1/tasks/{high['task_id']}")).json()["data"]
        assert detail["priority"] == 9
        listed = {t["task_id"]: t for t in (await client.get("/v1/tasks")).json()["data"]}
    assert listed[high["task_id"]]["priority"] == 9
    assert "priority" not in listed[normal["task_id"]] and "priority" not in listed[absent["task_id"]]
    row = await task_row(db, high["task_id"])
    # The generated ordering time of P3: available_at - priority x 30 s.
    assert row["priority"] == 9 and row["available_at"] - row["dispatch_at"] == timedelta(seconds=270)


async def test_times_are_converted_to_utc_and_delay_uses_the_database_clock(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        offset = await submit(
            client,
            tenant.queue_id,
            "offset",
            available_at="2030-06-01T12:00:00+02:00",
            deadline="2030-06-01T12:30:00.1234567-01:30",
        )
        assert offset["available_at"] == "2030-06-01T10:00:00.000000Z"
        # Beyond microseconds the fraction is truncated.
        assert offset["deadline"] == "2030-06-01T14:00:00.123456Z"
        before = await db_now(db)
        delayed = await submit(client, tenant.queue_id, "delayed", delay_s=90.5)
        after = await db_now(db)
        fractional = await submit(client, tenant.queue_id, "lower-case", available_at="2030-01-01t00:00:00.5z")
    due = parse_time(delayed["available_at"])
    assert before + timedelta(seconds=90.5) <= due <= after + timedelta(seconds=90.5)
    assert fractional["available_at"] == "2030-01-01T00:00:00.500000Z"


async def test_optional_fields_are_stored(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(
            client,
            tenant.queue_id,
            "k",
            max_attempts=7,
            backoff={"initial_ms": 250, "multiplier": 1.5},
            resource_key="objects/ü-42",
        )
    assert task["max_attempts"] == 7 and task["resource_key"] == "objects/ü-42"
    assert task["backoff"] == {"initial_ms": 250, "max_ms": 300000, "multiplier": 1.5}
    row = await task_row(db, task["task_id"])
    assert (row["backoff_initial_ms"], row["backoff_max_ms"], row["backoff_multiplier"]) == (250, 300000, 1.5)


async def test_a_resource_key_gets_its_occupancy_row_once(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        for key in ("a", "b"):
            await submit(client, tenant.queue_id, key, resource_key="printer-1")
        await submit(client, tenant.queue_id, "c", resource_key="printer-2")
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT namespace_id, resource_key, holder_task_id FROM resource_keys ORDER BY resource_key"
        )
    )
    assert rows == [
        {"namespace_id": tenant.namespace_id, "resource_key": "printer-1", "holder_task_id": None},
        {"namespace_id": tenant.namespace_id, "resource_key": "printer-2", "holder_task_id": None},
    ]


PAYLOADS = [
    {"big": 123456789012345678901234567890123456789, "negative": -(10**40)},
    [2**64, 2**63 - 1, -(2**63), 0, -0.0, 1.5, 1e300, "text", None, True, False, {"nested": [[]]}],
    None,
    "just a string ✓ with \u0000 and emoji 🚀",
    10**4000,
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=["big-ints", "mixed-array", "null", "string", "4001-digits"])
async def test_payload_round_trips_exactly(running_node, db, payload):
    tenant = await make_tenant(db)
    text = json.dumps({**TASK, "queue_id": tenant.queue_id, "payload": payload})
    async with running_node.client(tenant.token) as client:
        response = await client.post(
            "/v1/tasks", content=text, headers={"Idempotency-Key": "k", "Content-Type": "application/json"}
        )
        assert response.status_code == 201, response.text
        fetched = await client.get(f"/v1/tasks/{response.json()['data']['task_id']}")
    for document in (response.json(), fetched.json()):
        assert document["data"]["payload"] == payload
    # The digits are on the wire as sent, not rounded through a float.
    if isinstance(payload, dict):
        assert "123456789012345678901234567890123456789" in fetched.text


async def test_get_unknown_task_is_404(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await client.get("/v1/tasks/" + "0" * 32)
    assert_error(response, 404, "NOT_FOUND", "task_id")


async def test_list_filters_and_pages_newest_first(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        in_a = [(await submit(client, tenant.queues["a"], f"a{i}"))["task_id"] for i in range(5)]
        in_b = [(await submit(client, tenant.queues["b"], f"b{i}"))["task_id"] for i in range(2)]
        await client.post(f"/v1/tasks/{in_a[0]}/cancel")

        everything = (await client.get("/v1/tasks")).json()
        assert [t["task_id"] for t in everything["data"]] == sorted(in_a + in_b, reverse=True)
        assert everything["next_cursor"] is None
        assert "payload" not in everything["data"][0]

        seen, cursor, pages = [], None, 0
        while True:
            params = {"queue_id": tenant.queues["a"], "limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = (await client.get("/v1/tasks", params=params)).json()
            seen += [t["task_id"] for t in page["data"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(in_a, reverse=True) and pages == 3

        cancelled = (await client.get("/v1/tasks", params={"state": "cancelled"})).json()["data"]
        assert [t["task_id"] for t in cancelled] == [in_a[0]]
        queued_b = (await client.get("/v1/tasks", params={"state": "queued", "queue_id": tenant.queues["b"]})).json()
        assert [t["task_id"] for t in queued_b["data"]] == sorted(in_b, reverse=True)
        # A page that ends exactly at the last task says there is no more.
        exact = (await client.get("/v1/tasks", params={"limit": 7})).json()
        assert len(exact["data"]) == 7 and exact["next_cursor"] is None


async def test_cancel_queued_is_immediate_and_repeatable(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(client, tenant.queue_id, "k")
        first = await client.post(f"/v1/tasks/{task['task_id']}/cancel")
        again = await client.post(f"/v1/tasks/{task['task_id']}/cancel")
    assert first.status_code == 200 and again.status_code == 200
    cancelled = first.json()["data"]
    assert cancelled["state"] == "cancelled" and cancelled["cancel_requested"] is True
    assert cancelled["finished_at"] is not None
    assert again.json()["data"] == cancelled


@pytest.mark.parametrize("state", ["reserved", "running"])
async def test_cancel_reserved_or_running_only_requests_it(running_node, db, state):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(client, tenant.queue_id, "k")
        await set_columns(
            db,
            task["task_id"],
            "state = %s, reserved_at = NOW(6), lease_expires_at = NOW(6) + INTERVAL 30 SECOND",
            state,
        )
        response = await client.post(f"/v1/tasks/{task['task_id']}/cancel")
    assert response.status_code == 200
    data = response.json()["data"]
    # The dispatch side settles it; the state stays until then.
    assert data["state"] == state and data["cancel_requested"] is True and data["finished_at"] is None


@pytest.mark.parametrize("state", ["succeeded", "failed", "expired"])
async def test_cancel_finished_task_is_failed_precondition(running_node, db, state):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(client, tenant.queue_id, "k")
        await set_columns(db, task["task_id"], "state = %s, finished_at = NOW(6)", state)
        response = await client.post(f"/v1/tasks/{task['task_id']}/cancel")
        detail = (await client.get(f"/v1/tasks/{task['task_id']}")).json()["data"]
    assert state in assert_error(response, 409, "FAILED_PRECONDITION", "task_id")["message"]
    assert detail["state"] == state and detail["cancel_requested"] is False


async def test_result_and_error_appear_when_present(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        done = await submit(client, tenant.queue_id, "done")
        failed = await submit(client, tenant.queue_id, "failed")
        await set_columns(
            db,
            done["task_id"],
            "state = 'succeeded', result = %s, finished_at = NOW(6)",
            '{"echo": 123456789012345678901234567890}',
        )
        await set_columns(
            db,
            failed["task_id"],
            "state = 'failed', error = %s, finished_at = NOW(6)",
            '{"message": "boom", "code": "E1"}',
        )
        done_detail = (await client.get(f"/v1/tasks/{done['task_id']}")).json()["data"]
        failed_detail = (await client.get(f"/v1/tasks/{failed['task_id']}")).json()["data"]
    assert done_detail["result"] == {"echo": 123456789012345678901234567890} and "error" not in done_detail
    assert failed_detail["error"] == {"message": "boom", "code": "E1"} and "result" not in failed_detail
    assert "result" not in done and "error" not in done
