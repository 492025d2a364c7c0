"""Authentication and scopes: 401 without a valid credential, 403 without the route's scope,
404 for another tenant's queues and tasks (never revealing that they exist)."""

from __future__ import annotations

import pytest

from orbit_node.store.tenancy import SCOPES, TenancyStore

from ..nodeutil import Tenant, assert_error, make_tenant, make_token, stored_counts

TASK_BODY = {"handler": "object.prepare", "handler_version": "v1", "payload_version": "v1", "payload": {"n": 1}}


async def seed_task(running_node, tenant: Tenant, key: str = "seed") -> str:
    async with running_node.client(tenant.token) as client:
        response = await client.post(
            "/v1/tasks", json={**TASK_BODY, "queue_id": tenant.queue_id}, headers={"Idempotency-Key": key}
        )
    assert response.status_code == 201, response.text
    return response.json()["data"]["task_id"]


def routes(tenant: Tenant, task_id: str) -> list[tuple[str, str, str, dict]]:
    """(method, path, the scope it needs, request kwargs) for every /v1 route."""
    queue_id = tenant.queue_id
    return [
        (
            "POST",
            "/v1/tasks",
            "tasks:submit",
            {"json": {**TASK_BODY, "queue_id": queue_id}, "headers": {"Idempotency-Key": "matrix"}},
        ),
        ("GET", f"/v1/tasks/{task_id}", "tasks:read", {}),
        ("GET", "/v1/tasks", "tasks:read", {}),
        ("POST", f"/v1/tasks/{task_id}/cancel", "tasks:cancel", {}),
        ("GET", f"/v1/tasks/{task_id}/explain", "tasks:read", {}),
        ("POST", "/v1/queues", "queues:manage", {"json": {"name": "created-in-matrix"}}),
        ("GET", f"/v1/queues/{queue_id}", "queues:manage|tasks:read", {}),
        ("GET", "/v1/queues", "queues:manage|tasks:read", {}),
        ("POST", f"/v1/queues/{queue_id}/pause", "queues:manage", {}),
        ("POST", f"/v1/queues/{queue_id}/resume", "queues:manage", {}),
        ("PATCH", f"/v1/queues/{queue_id}/controls", "queues:manage", {"json": {"max_concurrency": 5}}),
    ]


ROUTE_IDS = [
    "submit",
    "get-task",
    "list-tasks",
    "cancel",
    "explain",
    "create-queue",
    "get-queue",
    "list-queues",
    "pause",
    "resume",
    "controls",
]


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
async def test_every_route_without_exactly_its_scope_is_403(running_node, db, index):
    tenant = await make_tenant(db)
    task_id = await seed_task(running_node, tenant)
    method, path, needed, kwargs = routes(tenant, task_id)[index]
    lacking = set(needed.split("|"))
    token = await make_token(db, tenant, {scope: "*" for scope in SCOPES if scope not in lacking})
    before = await stored_counts(db)
    async with running_node.client(token) as client:
        response = await client.request(method, path, **kwargs)
    assert_error(response, 403, "PERMISSION_DENIED", "authorization")
    assert await stored_counts(db) == before
    # ... and the same request with only that scope passes (so the 403 was about the scope).
    token = await make_token(db, tenant, {scope: "*" for scope in lacking})
    async with running_node.client(token) as client:
        response = await client.request(method, path, **kwargs)
    assert response.status_code in (200, 201), response.text


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
async def test_every_route_needs_a_credential(running_node, db, index):
    tenant = await make_tenant(db)
    task_id = await seed_task(running_node, tenant)
    method, path, _, kwargs = routes(tenant, task_id)[index]
    async with running_node.client() as client:
        response = await client.request(method, path, **kwargs)
    assert_error(response, 401, "UNAUTHENTICATED", "authorization")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="orbit"'


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
async def test_another_tenants_queue_or_task_is_404(running_node, db, index):
    owner = await make_tenant(db, "owner")
    task_id = await seed_task(running_node, owner)
    stranger = await make_tenant(db, "stranger", queues=("s1",))
    method, path, _, kwargs = routes(owner, task_id)[index]
    if path in ("/v1/tasks", "/v1/queues") and method == "GET":
        # Listings are confined to the caller's namespace: the owner's rows never appear.
        async with running_node.client(stranger.token) as client:
            response = await client.get(path)
        assert response.status_code == 200
        assert owner.queue_id not in response.text and task_id not in response.text
        if path == "/v1/tasks":
            async with running_node.client(stranger.token) as client:
                response = await client.get(path, params={"queue_id": owner.queue_id})
            assert_error(response, 404, "NOT_FOUND", "queue_id")
        return
    if path == "/v1/queues":
        # Creating names no existing queue; names are unique per namespace only, so the
        # owner's queue name is free in the stranger's namespace (and reveals nothing).
        async with running_node.client(stranger.token) as client:
            response = await client.post(path, json={"name": "q1"})
        assert response.status_code == 201 and response.json()["data"]["queue_id"] != owner.queue_id
        return
    before = await stored_counts(db)
    async with running_node.client(stranger.token) as client:
        response = await client.request(method, path, **kwargs)
    field = "task_id" if "/tasks" in path and path != "/v1/tasks" else "queue_id"
    # The explanation's message comes from the lease store ("task ... not found").
    assert_error(response, 404, "NOT_FOUND", field, named=not path.endswith("/explain"))
    assert owner.application_id not in response.text
    assert await stored_counts(db) == before
    # Nothing changed on the owner's side either.
    async with running_node.client(owner.token) as client:
        task = (await client.get(f"/v1/tasks/{task_id}")).json()["data"]
        queue = (await client.get(f"/v1/queues/{owner.queue_id}")).json()["data"]
    assert task["state"] == "queued" and task["cancel_requested"] is False
    assert queue["paused"] is False and queue["max_concurrency"] is None


async def test_bad_credentials_are_401(running_node, db):
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    revoked_id, revoked = await tenancy.create_credential(tenant.namespace_id, "old", {"tasks:read": "*"})
    await tenancy.revoke_credential(revoked_id)
    unknown = "orb_" + "0" * 32 + "1" * 64
    wrong_secret = tenant.token[:-1] + ("0" if tenant.token[-1] != "0" else "1")
    headers = [
        {},
        {"Authorization": ""},
        {"Authorization": f"Basic {tenant.token}"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": f"Bearer {unknown}"},
        {"Authorization": f"Bearer {wrong_secret}"},
        {"Authorization": f"Bearer {revoked}"},
    ]
    async with running_node.client() as client:
        for header in headers:
            response = await client.get("/v1/tasks", headers=header)
            assert_error(response, 401, "UNAUTHENTICATED", "authorization")
        # Two Authorization headers are ambiguous.
        response = await client.get(
            "/v1/tasks",
            headers=[("Authorization", f"Bearer {tenant.token}"), ("Authorization", f"Bearer {tenant.token}")],
        )
        assert_error(response, 401, "UNAUTHENTICATED", "authorization")
        # The scheme is case-insensitive.
        response = await client.get("/v1/tasks", headers={"Authorization": f"bearer {tenant.token}"})
        assert response.status_code == 200


async def test_queue_scoped_grants(running_node, db):
    tenant = await make_tenant(db, queues=("allowed", "other"))
    allowed, other = tenant.queues["allowed"], tenant.queues["other"]
    token = await make_token(
        db,
        tenant,
        {"tasks:submit": [allowed], "tasks:read": [allowed], "tasks:cancel": [allowed], "queues:manage": [allowed]},
    )
    other_task = await seed_task(
        running_node, Tenant(tenant.application_id, tenant.namespace_id, {"o": other}, tenant.token)
    )
    async with running_node.client(token) as client:
        ok = await client.post("/v1/tasks", json={**TASK_BODY, "queue_id": allowed}, headers={"Idempotency-Key": "a"})
        assert ok.status_code == 201
        own_task = ok.json()["data"]["task_id"]
        denied = await client.post("/v1/tasks", json={**TASK_BODY, "queue_id": other}, headers={"Idempotency-Key": "b"})
        assert_error(denied, 403, "PERMISSION_DENIED", "authorization")
        assert_error(await client.get(f"/v1/tasks/{other_task}"), 403, "PERMISSION_DENIED", "authorization")
        assert_error(await client.post(f"/v1/tasks/{other_task}/cancel"), 403, "PERMISSION_DENIED", "authorization")
        assert_error(
            await client.get("/v1/tasks", params={"queue_id": other}), 403, "PERMISSION_DENIED", "authorization"
        )
        # The unfiltered listing shows only the queues the grant names.
        listed = [t["task_id"] for t in (await client.get("/v1/tasks")).json()["data"]]
        assert listed == [own_task]
        assert [q["queue_id"] for q in (await client.get("/v1/queues")).json()["data"]] == [allowed]
        assert_error(await client.get(f"/v1/queues/{other}"), 403, "PERMISSION_DENIED", "authorization")
        assert_error(await client.post(f"/v1/queues/{other}/pause"), 403, "PERMISSION_DENIED", "authorization")
        assert (await client.post(f"/v1/queues/{allowed}/pause")).status_code == 200
        # A queue-scoped queues:manage cannot create queues: a new queue is in no list.
        assert_error(await client.post("/v1/queues", json={"name": "new"}), 403, "PERMISSION_DENIED", "authorization")


async def test_either_queue_scope_reads_queues(running_node, db):
    tenant = await make_tenant(db)
    for scope in ("queues:manage", "tasks:read"):
        token = await make_token(db, tenant, {scope: "*"})
        async with running_node.client(token) as client:
            assert (await client.get(f"/v1/queues/{tenant.queue_id}")).status_code == 200
            assert len((await client.get("/v1/queues")).json()["data"]) == 1


async def test_the_application_comes_from_the_credential(running_node, db):
    # Tasks carry the application of the queue's namespace, whatever the client claims.
    tenant = await make_tenant(db, "real-app")
    await make_tenant(db, "claimed-app")
    async with running_node.client(tenant.token) as client:
        response = await client.post(
            "/v1/tasks",
            json={**TASK_BODY, "queue_id": tenant.queue_id},
            headers={"Idempotency-Key": "k", "X-Orbit-Application": "claimed-app"},
        )
    assert response.status_code == 201
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT application_id, namespace_id FROM tasks"))
    assert rows == [{"application_id": tenant.application_id, "namespace_id": tenant.namespace_id}]
