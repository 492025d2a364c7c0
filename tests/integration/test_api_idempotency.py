"""Idempotent acceptance: 201 first, 200 for an identical repeat, 409 for a changed request,
exactly one task under concurrency, keys scoped per namespace."""

from __future__ import annotations

import httpx
import pytest
import trio

from ..nodeutil import assert_error, make_tenant, make_token, stored_counts


def request_body(queue_id: str, **extra) -> dict:
    body = {
        "queue_id": queue_id,
        "handler": "object.prepare",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {"object_ref": "objects/example", "operation_ref": "prepare-001"},
    }
    body.update(extra)
    return body


async def submit(client, key: str, body: dict):
    return await client.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})


async def test_first_201_repeat_200_same_task_changed_409(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        first = await submit(client, "prepare-operation-001", request_body(tenant.queue_id, priority=9))
        assert first.status_code == 201, first.text
        repeat = await submit(client, "prepare-operation-001", request_body(tenant.queue_id, priority=9))
        assert repeat.status_code == 200, repeat.text
        assert repeat.json()["data"] == first.json()["data"]
        assert repeat.json()["request_id"] != first.json()["request_id"]

        for changed in (
            request_body(tenant.queue_id, priority=4),  # same key, changed priority
            request_body(tenant.queue_id),  # same key, priority dropped to the default 0
            request_body(tenant.queue_id, priority=9, max_attempts=5),
            {**request_body(tenant.queue_id, priority=9), "payload": {"object_ref": "objects/other"}},
        ):
            conflict = await submit(client, "prepare-operation-001", changed)
            assert_error(conflict, 409, "IDEMPOTENCY_CONFLICT", "Idempotency-Key")
    assert await stored_counts(db) == {"tasks": 1, "idempotency_records": 1, "resource_keys": 0}


async def test_priority_zero_and_absent_are_the_same_request(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        first = await submit(client, "k", request_body(tenant.queue_id))
        explicit_zero = await submit(client, "k", request_body(tenant.queue_id, priority=0))
        assert (first.status_code, explicit_zero.status_code) == (201, 200)
        assert explicit_zero.json()["data"]["task_id"] == first.json()["data"]["task_id"]
        # Both directions: a task accepted with an explicit 0 repeats without the field.
        second = await submit(client, "k2", request_body(tenant.queue_id, priority=0))
        absent = await submit(client, "k2", request_body(tenant.queue_id))
        assert (second.status_code, absent.status_code) == (201, 200)
        assert "priority" not in second.json()["data"]


async def test_equivalent_spellings_are_one_request(running_node, db):
    tenant = await make_tenant(db)
    # The digest is over the validated request: the same instant in another offset, an
    # explicit default and reordered payload keys are the same request.
    async with running_node.client(tenant.token) as client:
        first = await submit(
            client,
            "k",
            request_body(tenant.queue_id, available_at="2030-01-01T01:00:00+01:00", payload={"b": 2, "a": 1}),
        )
        same = await submit(
            client,
            "k",
            request_body(
                tenant.queue_id, available_at="2030-01-01T00:00:00.000000Z", max_attempts=3, payload={"a": 1, "b": 2}
            ),
        )
        assert (first.status_code, same.status_code) == (201, 200), same.text
        assert first.json()["data"]["available_at"] == "2030-01-01T00:00:00.000000Z"


async def test_fifty_parallel_identical_submits_create_one_task(running_node, db):
    tenant = await make_tenant(db)
    statuses: list[int] = []
    task_ids: set[str] = set()
    body = request_body(tenant.queue_id, priority=9, resource_key="objects/example")

    async def one(client):
        response = await submit(client, "parallel-key", body)
        statuses.append(response.status_code)
        task_ids.add(response.json()["data"]["task_id"])

    # Fifty connections, so the requests really run at once on the node.
    async with running_node.client(tenant.token, limits=httpx.Limits(max_connections=50)) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(one, client)
    assert sorted(statuses) == [200] * 49 + [201]
    assert len(task_ids) == 1
    assert await stored_counts(db) == {"tasks": 1, "idempotency_records": 1, "resource_keys": 1}


async def test_fifty_parallel_submits_of_one_key_with_different_bodies(running_node, db):
    # One wins (201); the identical ones repeat it (200); the different ones conflict (409).
    tenant = await make_tenant(db)
    results: list[tuple[int, int]] = []

    async def one(client, priority: int):
        response = await submit(client, "mixed-key", request_body(tenant.queue_id, priority=priority))
        results.append((priority, response.status_code))

    async with running_node.client(tenant.token, limits=httpx.Limits(max_connections=50)) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(one, client, i % 2)
    created = [p for p, status in results if status == 201]
    assert len(created) == 1
    winner = created[0]
    for priority, status in results:
        if priority == winner:
            assert status in (200, 201)
        else:
            assert status == 409
    assert (await stored_counts(db))["tasks"] == 1


async def test_keys_are_scoped_per_namespace(running_node, db):
    a = await make_tenant(db, "app-a")
    b = await make_tenant(db, "app-b")
    # A second namespace of the same application is a separate key space too.
    a2 = await make_tenant(db, "app-a", namespace="other")
    created = []
    for tenant in (a, b, a2):
        async with running_node.client(tenant.token) as client:
            response = await submit(client, "shared-key", request_body(tenant.queue_id))
            assert response.status_code == 201, response.text
            created.append(response.json()["data"]["task_id"])
    assert len(set(created)) == 3
    assert await stored_counts(db) == {"tasks": 3, "idempotency_records": 3, "resource_keys": 0}


async def test_key_is_shared_by_credentials_of_one_namespace(running_node, db):
    tenant = await make_tenant(db)
    other_token = await make_token(db, tenant, {"tasks:submit": "*"})
    async with running_node.client(tenant.token) as client:
        first = await submit(client, "k", request_body(tenant.queue_id))
    async with running_node.client(other_token) as client:
        repeat = await submit(client, "k", request_body(tenant.queue_id))
    assert (first.status_code, repeat.status_code) == (201, 200)
    assert first.json()["data"]["task_id"] == repeat.json()["data"]["task_id"]


@pytest.mark.parametrize("key", ["a", "K" * 255, "!#$%&'*+-.^_`|~", "prepare-operation-001"])
async def test_any_visible_ascii_key_of_1_to_255_is_accepted(running_node, db, key):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await submit(client, key, request_body(tenant.queue_id))
        assert response.status_code == 201, response.text
        assert (await submit(client, key, request_body(tenant.queue_id))).status_code == 200


async def test_keys_differ_by_case(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        assert (await submit(client, "Key", request_body(tenant.queue_id))).status_code == 201
        assert (await submit(client, "key", request_body(tenant.queue_id))).status_code == 201
