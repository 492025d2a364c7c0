"""Queues over real HTTP: create (unique name per namespace), get, list, pause/resume, controls."""

from __future__ import annotations

import pytest

from ..nodeutil import assert_error, make_tenant

QUEUE_KEYS = {
    "queue_id",
    "name",
    "paused",
    "max_concurrency",
    "max_starts_per_second",
    "max_running_per_key",
    "created_at",
}


async def queue_row(db, queue_id: str) -> dict:
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT namespace_id, application_id, name, paused, max_concurrency, max_starts_per_second,"
            " max_running_per_key FROM queues WHERE queue_id = %s",
            (queue_id,),
        )
    )
    return rows[0]


async def test_create_get_and_duplicate_name(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        created = await client.post("/v1/queues", json={"name": "emails.v2", "max_concurrency": 10})
        assert created.status_code == 201, created.text
        queue = created.json()["data"]
        assert set(queue) == QUEUE_KEYS
        assert len(queue["queue_id"]) == 32 and queue["name"] == "emails.v2"
        assert queue["paused"] is False and queue["max_concurrency"] == 10 and queue["max_starts_per_second"] is None
        assert queue["max_running_per_key"] == 1  # one task of a resource key at a time, as before the control
        assert (await client.get(f"/v1/queues/{queue['queue_id']}")).json()["data"] == queue
        duplicate = await client.post("/v1/queues", json={"name": "emails.v2"})
        assert_error(duplicate, 409, "ALREADY_EXISTS", "name")
        unknown = await client.get("/v1/queues/" + "0" * 32)
        assert_error(unknown, 404, "NOT_FOUND", "queue_id")
    row = await queue_row(db, queue["queue_id"])
    assert (row["namespace_id"], row["application_id"]) == (tenant.namespace_id, tenant.application_id)


BAD_CREATE = [
    ("no name", {}, "name"),
    ("empty name", {"name": ""}, "name"),
    ("name with space", {"name": "my queue"}, "name"),
    ("name starts with dot", {"name": ".hidden"}, "name"),
    ("name too long", {"name": "q" * 129}, "name"),
    ("name number", {"name": 5}, "name"),
    ("negative concurrency", {"name": "q", "max_concurrency": -1}, "max_concurrency"),
    ("fractional rate", {"name": "q", "max_starts_per_second": 1.5}, "max_starts_per_second"),
    ("rate over INT", {"name": "q", "max_starts_per_second": 2**31}, "max_starts_per_second"),
    ("bool concurrency", {"name": "q", "max_concurrency": True}, "max_concurrency"),
    ("zero per key", {"name": "q", "max_running_per_key": 0}, "max_running_per_key"),
    ("null per key", {"name": "q", "max_running_per_key": None}, "max_running_per_key"),
    ("unknown field", {"name": "q", "paused": True}, "paused"),
]


@pytest.mark.parametrize("body, field", [c[1:] for c in BAD_CREATE], ids=[c[0] for c in BAD_CREATE])
async def test_bad_create_is_400_and_creates_nothing(running_node, db, body, field):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        response = await client.post("/v1/queues", json=body)
        assert_error(response, 400, "INVALID_ARGUMENT", field)
        assert len((await client.get("/v1/queues")).json()["data"]) == 1


async def test_pause_and_resume_are_idempotent(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        for path, paused in (("pause", True), ("pause", True), ("resume", False), ("resume", False)):
            response = await client.post(f"/v1/queues/{tenant.queue_id}/{path}")
            assert response.status_code == 200 and response.json()["data"]["paused"] is paused
            assert (await queue_row(db, tenant.queue_id))["paused"] == int(paused)


async def test_controls_change_only_what_is_named(running_node, db):
    tenant = await make_tenant(db)
    path = f"/v1/queues/{tenant.queue_id}/controls"
    async with running_node.client(tenant.token) as client:
        both = (await client.patch(path, json={"max_concurrency": 4, "max_starts_per_second": 20})).json()["data"]
        assert (both["max_concurrency"], both["max_starts_per_second"]) == (4, 20)
        one = (await client.patch(path, json={"max_starts_per_second": 0})).json()["data"]
        assert (one["max_concurrency"], one["max_starts_per_second"]) == (4, 0)
        unlimited = (await client.patch(path, json={"max_concurrency": None})).json()["data"]
        assert (unlimited["max_concurrency"], unlimited["max_starts_per_second"]) == (None, 0)
        assert_error(await client.patch(path, json={}), 400, "INVALID_ARGUMENT", "body")
        assert_error(await client.patch(path, json={"max_concurrency": -5}), 400, "INVALID_ARGUMENT", "max_concurrency")
        assert_error(await client.patch(path, json={"paused": True}), 400, "INVALID_ARGUMENT", "paused")
        assert_error(await client.patch(path), 400, "INVALID_ARGUMENT", "body")
        assert_error(
            await client.patch("/v1/queues/" + "0" * 32 + "/controls", json={"max_concurrency": 1}),
            404,
            "NOT_FOUND",
            "queue_id",
        )
    row = await queue_row(db, tenant.queue_id)
    assert (row["max_concurrency"], row["max_starts_per_second"]) == (None, 0)


async def test_max_running_per_key_is_an_integer_from_1_to_1000(running_node, db):
    tenant = await make_tenant(db)
    path = f"/v1/queues/{tenant.queue_id}/controls"
    async with running_node.client(tenant.token) as client:
        created = await client.post("/v1/queues", json={"name": "exports", "max_running_per_key": 3})
        assert created.status_code == 201, created.text
        assert created.json()["data"]["max_running_per_key"] == 3
        for good in (1000, 1, 3):
            changed = (await client.patch(path, json={"max_running_per_key": good})).json()["data"]
            assert changed["max_running_per_key"] == good
        for bad in (0, -1, 1001, 2.5, 3.0, "3", True, None, [3]):
            response = await client.patch(path, json={"max_running_per_key": bad})
            assert_error(response, 400, "INVALID_ARGUMENT", "max_running_per_key")
            assert "from 1 to 1000" in response.json()["error"]["message"], bad
        # The other controls are kept, and naming them keeps this one.
        both = (await client.patch(path, json={"max_concurrency": 7})).json()["data"]
        assert (both["max_concurrency"], both["max_running_per_key"]) == (7, 3)
    row = await queue_row(db, tenant.queue_id)
    assert (row["max_concurrency"], row["max_running_per_key"]) == (7, 3)


async def test_list_pages_in_id_order(running_node, db):
    tenant = await make_tenant(db, queues=[f"q{i}" for i in range(5)])
    async with running_node.client(tenant.token) as client:
        seen, cursor = [], None
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/v1/queues", params=params)).json()
            seen += [q["queue_id"] for q in page["data"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert seen == sorted(tenant.queues.values())
