"""The /v1/plans routes over real HTTP: life cycle, strict definitions (the task rules of
POST /v1/tasks), scopes, tenancy, and every response against schema/openapi.yaml."""

from __future__ import annotations

import pytest

from orbit_node.store.plans import PlanStore
from orbit_node.store.tenancy import SCOPES

from ..nodeutil import Tenant, assert_error, count_rows, make_tenant, make_token
from ..plans_seed import TASK, definition, set_next_fire, whole_second
from .test_api_openapi import DOCUMENT, Checker, component, documented_routes

GOOD = definition(priority=7, interval_s=60)
PLAN_TABLES = ("plans", "plan_versions", "tasks", "idempotency_records")


async def stored(db) -> dict[str, int]:
    return {table: await count_rows(db, table) for table in PLAN_TABLES}


async def new_plan(client, tenant: Tenant, name: str = "nightly", document: dict | None = GOOD) -> dict:
    body = {"name": name, "queue_id": tenant.queue_id}
    if document is not None:
        body["definition"] = document
    response = await client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_plan_life_cycle_and_every_response_matches_the_document(running_node, db):
    check = Checker()
    tenant = await make_tenant(db)
    other = await make_tenant(db, "other")
    read_only = await make_token(db, tenant, {"tasks:read": "*"})
    component("CreatePlanRequest").validate({"name": "nightly", "queue_id": tenant.queue_id, "definition": GOOD})
    async with running_node.client(tenant.token) as client:
        created = check(
            await client.post("/v1/plans", json={"name": "nightly", "queue_id": tenant.queue_id, "definition": GOOD}),
            "/v1/plans",
        )["data"]
        plan_id = created["plan_id"]
        assert (created["active_version"], created["paused"], created["last_fire_at"]) == (1, False, None)
        assert created["next_fire_at"].endswith(":00.000000Z")  # a minute mark: epoch-aligned 60 s
        check(await client.post("/v1/plans", json={"name": "nightly", "queue_id": tenant.queue_id}), "/v1/plans")
        check(await client.post("/v1/plans", json={"name": "x", "queue_id": other.queue_id}), "/v1/plans")
        check(
            await client.post("/v1/plans", json={"name": "x", "queue_id": tenant.queue_id, "definition": {}}),
            "/v1/plans",
        )
        check(await client.post("/v1/plans", content=b"{}", headers={"Content-Type": "text/plain"}), "/v1/plans")
        check(await client.post("/v1/plans", content=b" " * (2 * 1024 * 1024)), "/v1/plans")
        bare = check(await client.post("/v1/plans", json={"name": "bare", "queue_id": tenant.queue_id}), "/v1/plans")
        assert (bare["data"]["active_version"], bare["data"]["next_fire_at"]) == (None, None)

        listed = check(await client.get("/v1/plans", params={"limit": 1}), "/v1/plans")
        second = check(await client.get("/v1/plans", params={"cursor": listed["next_cursor"]}), "/v1/plans")
        assert {p["plan_id"] for p in listed["data"] + second["data"]} == {plan_id, bare["data"]["plan_id"]}
        assert second["next_cursor"] is None
        check(await client.get("/v1/plans", params={"queue_id": other.queue_id}), "/v1/plans")
        check(await client.get("/v1/plans", params={"limit": 0}), "/v1/plans")
        check(await client.get(f"/v1/plans/{plan_id}"), "/v1/plans/{plan_id}")
        check(await client.get("/v1/plans/" + "0" * 32), "/v1/plans/{plan_id}")
        check(await client.get("/v1/plans/xyz"), "/v1/plans/{plan_id}")

        edited = definition(priority=2, cron="30 2 * * *", time_zone="Europe/Berlin", catch_up="fire_once")
        v2 = check(
            await client.post(f"/v1/plans/{plan_id}/versions", json={"definition": edited}),
            "/v1/plans/{plan_id}/versions",
        )
        assert (v2["data"]["version"], v2["data"]["definition"]) == (2, edited)
        check(
            await client.post(f"/v1/plans/{plan_id}/versions", json={"definition": GOOD, "x": 1}),
            "/v1/plans/{plan_id}/versions",
        )
        check(
            await client.post("/v1/plans/" + "0" * 32 + "/versions", json={"definition": GOOD}),
            "/v1/plans/{plan_id}/versions",
        )
        check(
            await client.post(f"/v1/plans/{plan_id}/versions", content=b"{}", headers={"Content-Type": "text/xml"}),
            "/v1/plans/{plan_id}/versions",
        )
        check(
            await client.post(f"/v1/plans/{plan_id}/versions", content=b" " * (2 * 1024 * 1024)),
            "/v1/plans/{plan_id}/versions",
        )
        page = check(
            await client.get(f"/v1/plans/{plan_id}/versions", params={"limit": 1}), "/v1/plans/{plan_id}/versions"
        )
        rest = check(
            await client.get(f"/v1/plans/{plan_id}/versions", params={"cursor": page["next_cursor"]}),
            "/v1/plans/{plan_id}/versions",
        )
        assert [v["version"] for v in page["data"] + rest["data"]] == [1, 2]
        check(
            await client.get(f"/v1/plans/{plan_id}/versions", params={"cursor": "bad"}), "/v1/plans/{plan_id}/versions"
        )
        check(await client.get("/v1/plans/" + "0" * 32 + "/versions"), "/v1/plans/{plan_id}/versions")
        one = check(await client.get(f"/v1/plans/{plan_id}/versions/1"), "/v1/plans/{plan_id}/versions/{version}")
        assert one["data"]["definition"] == GOOD
        check(await client.get(f"/v1/plans/{plan_id}/versions/3"), "/v1/plans/{plan_id}/versions/{version}")
        check(await client.get(f"/v1/plans/{plan_id}/versions/0"), "/v1/plans/{plan_id}/versions/{version}")

        # Adding a version did not change the plan; activating it does.
        assert (await client.get(f"/v1/plans/{plan_id}")).json()["data"]["active_version"] == 1
        activated = check(
            await client.post(f"/v1/plans/{plan_id}/activate", json={"version": 2}), "/v1/plans/{plan_id}/activate"
        )["data"]
        assert activated["active_version"] == 2
        # 02:30 in Berlin is 00:30 or 01:30 UTC.
        assert activated["next_fire_at"][11:] in ("00:30:00.000000Z", "01:30:00.000000Z")
        check(await client.post(f"/v1/plans/{plan_id}/activate", json={"version": 9}), "/v1/plans/{plan_id}/activate")
        check(await client.post(f"/v1/plans/{plan_id}/activate", json={"version": 2.0}), "/v1/plans/{plan_id}/activate")
        check(
            await client.post(f"/v1/plans/{plan_id}/activate", content=b"1", headers={"Content-Type": "image/png"}),
            "/v1/plans/{plan_id}/activate",
        )
        check(
            await client.post(f"/v1/plans/{plan_id}/activate", content=b" " * (2 * 1024 * 1024)),
            "/v1/plans/{plan_id}/activate",
        )
        check(
            await client.post("/v1/plans/" + "0" * 32 + "/activate", json={"version": 1}),
            "/v1/plans/{plan_id}/activate",
        )

        paused = check(await client.post(f"/v1/plans/{plan_id}/pause"), "/v1/plans/{plan_id}/pause")["data"]
        assert (paused["paused"], paused["next_fire_at"], paused["active_version"]) == (True, None, 2)
        check(await client.post(f"/v1/plans/{plan_id}/pause", json={"now": True}), "/v1/plans/{plan_id}/pause")
        check(await client.post("/v1/plans/" + "0" * 32 + "/pause"), "/v1/plans/{plan_id}/pause")
        check(
            await client.post(f"/v1/plans/{plan_id}/pause", content=b"{}", headers={"Content-Type": "text/plain"}),
            "/v1/plans/{plan_id}/pause",
        )
        check(
            await client.post(f"/v1/plans/{plan_id}/pause", content=b" " * (2 * 1024 * 1024)),
            "/v1/plans/{plan_id}/pause",
        )
        resumed = check(await client.post(f"/v1/plans/{plan_id}/resume", json={}), "/v1/plans/{plan_id}/resume")["data"]
        assert (resumed["paused"], resumed["next_fire_at"]) == (False, activated["next_fire_at"])
        check(await client.post(f"/v1/plans/{plan_id}/resume", json={"x": 1}), "/v1/plans/{plan_id}/resume")
        check(await client.post("/v1/plans/" + "0" * 32 + "/resume"), "/v1/plans/{plan_id}/resume")
        check(
            await client.post(f"/v1/plans/{plan_id}/resume", content=b"{}", headers={"Content-Type": "text/plain"}),
            "/v1/plans/{plan_id}/resume",
        )
        check(
            await client.post(f"/v1/plans/{plan_id}/resume", content=b" " * (2 * 1024 * 1024)),
            "/v1/plans/{plan_id}/resume",
        )

        check(await client.get(f"/v1/plans/{plan_id}/tasks"), "/v1/plans/{plan_id}/tasks")
        check(await client.get(f"/v1/plans/{plan_id}/tasks", params={"state": "done"}), "/v1/plans/{plan_id}/tasks")
        check(await client.get("/v1/plans/" + "0" * 32 + "/tasks"), "/v1/plans/{plan_id}/tasks")

    # A fire of version 2 (put in the past by writing the row), then the task listing.
    await set_next_fire(db, plan_id, await whole_second(db))
    result = await PlanStore(db).fire(plan_id, limit=10)
    assert result.created == 1
    async with running_node.client(tenant.token) as client:
        tasks = check(await client.get(f"/v1/plans/{plan_id}/tasks", params={"limit": 1}), "/v1/plans/{plan_id}/tasks")
    (task,) = tasks["data"]
    assert (task["priority"], task["plan_version"], task["handler"]) == (2, 2, TASK["handler"])

    async with running_node.client(read_only) as client:
        check(await client.post("/v1/plans", json={"name": "y", "queue_id": tenant.queue_id}), "/v1/plans")
        check(
            await client.post(f"/v1/plans/{plan_id}/versions", json={"definition": GOOD}),
            "/v1/plans/{plan_id}/versions",
        )
        check(await client.post(f"/v1/plans/{plan_id}/activate", json={"version": 1}), "/v1/plans/{plan_id}/activate")
        check(await client.post(f"/v1/plans/{plan_id}/pause"), "/v1/plans/{plan_id}/pause")
        check(await client.post(f"/v1/plans/{plan_id}/resume"), "/v1/plans/{plan_id}/resume")
    async with running_node.client(await make_token(db, tenant, {"queues:manage": "*"})) as client:
        check(await client.get("/v1/plans"), "/v1/plans")
        check(await client.get(f"/v1/plans/{plan_id}"), "/v1/plans/{plan_id}")
        check(await client.get(f"/v1/plans/{plan_id}/versions"), "/v1/plans/{plan_id}/versions")
        check(await client.get(f"/v1/plans/{plan_id}/versions/1"), "/v1/plans/{plan_id}/versions/{version}")
        check(await client.get(f"/v1/plans/{plan_id}/tasks"), "/v1/plans/{plan_id}/tasks")
    async with running_node.client() as anonymous:
        for method, template in [
            ("POST", "/v1/plans"),
            ("GET", "/v1/plans"),
            ("GET", "/v1/plans/{plan_id}"),
            ("POST", "/v1/plans/{plan_id}/versions"),
            ("GET", "/v1/plans/{plan_id}/versions"),
            ("GET", "/v1/plans/{plan_id}/versions/{version}"),
            ("POST", "/v1/plans/{plan_id}/activate"),
            ("POST", "/v1/plans/{plan_id}/pause"),
            ("POST", "/v1/plans/{plan_id}/resume"),
            ("GET", "/v1/plans/{plan_id}/tasks"),
        ]:
            path = template.replace("{plan_id}", plan_id).replace("{version}", "1")
            check(await anonymous.request(method, path), template)

    plan_operations = {
        (method, path)
        for path, methods in documented_routes(websocket=False).items()
        if path.startswith("/v1/plans")
        for method in methods
    }
    assert len(plan_operations) == 10
    assert {(m, p) for m, p, _ in check.seen if p.startswith("/v1/plans")} == plan_operations
    # Every documented status of every plan operation was produced by a real response, but
    # those every /v1 operation declares alike: 405 (another method on the path), 429 (fair
    # admission of a saturated node) and 503 (the database is gone).
    documented = {
        (method.upper(), path, status)
        for path, item in DOCUMENT["paths"].items()
        if path.startswith("/v1/plans")
        for method, operation in item.items()
        for status in operation["responses"]
        if status not in ("405", "429", "503")
    }
    assert documented <= check.seen, sorted(documented - check.seen)


BAD_DEFINITIONS = [
    # (what is wrong, the definition, the field named)
    ("invalid cron value", definition(cron="61 * * * *"), "definition.schedule.cron"),
    ("cron of four fields", definition(cron="* * * *"), "definition.schedule.cron"),
    ("cron of six fields", definition(cron="0 * * * * *"), "definition.schedule.cron"),
    ("cron nickname", definition(cron="@hourly"), "definition.schedule.cron"),
    ("cron that never matches", definition(cron="0 0 30 2 *"), "definition.schedule.cron"),
    ("cron of letters", definition(cron="a b c d e"), "definition.schedule.cron"),
    ("cron not a string", definition(cron=5), "definition.schedule.cron"),
    ("unknown definition field", {**definition(interval_s=60), "colour": "blue"}, "definition.colour"),
    ("unknown schedule field", definition(interval_s=60, every="1h"), "definition.schedule.every"),
    ("unknown task field", definition(task={**TASK, "colour": "blue"}, interval_s=60), "definition.task.colour"),
    (
        "unknown backoff field",
        definition(task={**TASK, "backoff": {"jitter": 1}}, interval_s=60),
        "definition.task.backoff.jitter",
    ),
    ("priority 9.0", definition(priority=9.0, interval_s=60), "definition.task.priority"),
    ("priority 10", definition(priority=10, interval_s=60), "definition.task.priority"),
    ("priority -1", definition(priority=-1, interval_s=60), "definition.task.priority"),
    ("priority as a string", definition(priority="7", interval_s=60), "definition.task.priority"),
    ("priority true", definition(priority=True, interval_s=60), "definition.task.priority"),
    ("priority null", definition(task={**TASK, "priority": None}, interval_s=60), "definition.task.priority"),
    ("interval 0", definition(interval_s=0), "definition.schedule.interval_s"),
    ("interval 1.5", definition(interval_s=1.5), "definition.schedule.interval_s"),
    ("interval as a string", definition(interval_s="60"), "definition.schedule.interval_s"),
    ("neither interval nor cron", definition(catch_up="skip"), "definition.schedule"),
    ("unknown time zone", definition(cron="0 * * * *", time_zone="Mars/Olympus"), "definition.schedule.time_zone"),
    (
        "time zone as a path",
        definition(cron="0 * * * *", time_zone="../../etc/passwd"),
        "definition.schedule.time_zone",
    ),
    ("time zone without cron", definition(interval_s=60, time_zone="UTC"), "definition.schedule.time_zone"),
    ("unknown catch-up policy", definition(interval_s=60, catch_up="all"), "definition.schedule.catch_up"),
    ("grace 0", definition(interval_s=60, grace_s=0), "definition.schedule.grace_s"),
    ("bad start_at", definition(interval_s=60, start_at="tomorrow"), "definition.schedule.start_at"),
    (
        "end before start",
        definition(interval_s=60, start_at="2030-01-02T00:00:00Z", end_at="2030-01-01T00:00:00Z"),
        "definition.schedule.end_at",
    ),
    ("task queue_id", definition(task={**TASK, "queue_id": "1" * 32}, interval_s=60), "definition.task.queue_id"),
    (
        "task available_at",
        definition(task={**TASK, "available_at": "2030-01-01T00:00:00Z"}, interval_s=60),
        "definition.task.available_at",
    ),
    ("task delay_s", definition(task={**TASK, "delay_s": 5}, interval_s=60), "definition.task.delay_s"),
    (
        "task deadline",
        definition(task={**TASK, "deadline": "2030-01-01T00:00:00Z"}, interval_s=60),
        "definition.task.deadline",
    ),
    (
        "task without payload",
        definition(task={k: v for k, v in TASK.items() if k != "payload"}, interval_s=60),
        "definition.task.payload",
    ),
    ("bad handler", definition(task={**TASK, "handler": "has space"}, interval_s=60), "definition.task.handler"),
    ("max_attempts 0", definition(task={**TASK, "max_attempts": 0}, interval_s=60), "definition.task.max_attempts"),
    ("task not an object", {"task": [], "schedule": {"interval_s": 60}}, "definition.task"),
    ("no schedule", {"task": TASK}, "definition.schedule"),
    ("definition not an object", "every minute", "definition"),
]


# Rules a JSON Schema cannot express (cron and time zone semantics, the order of start and
# end, and "9.0" which JSON Schema counts as an integer). Date formats it can: a pattern.
SCHEMA_BLIND = {
    "invalid cron value",
    "cron that never matches",
    "cron of letters",
    "unknown time zone",
    "time zone as a path",
    "end before start",
    "priority 9.0",
}


@pytest.mark.parametrize("case, document, field", BAD_DEFINITIONS, ids=[c[0] for c in BAD_DEFINITIONS])
async def test_a_bad_definition_is_400_naming_the_field_and_creates_nothing(running_node, db, case, document, field):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        plan = await new_plan(client, tenant, document=None)
        before = await stored(db)
        response = await client.post(
            "/v1/plans", json={"name": "bad", "queue_id": tenant.queue_id, "definition": document}
        )
        assert_error(response, 400, "INVALID_ARGUMENT", field)
        response = await client.post(f"/v1/plans/{plan['plan_id']}/versions", json={"definition": document})
        assert_error(response, 400, "INVALID_ARGUMENT", field)
        after = (await client.get(f"/v1/plans/{plan['plan_id']}")).json()["data"]
    assert await stored(db) == before
    assert after == plan
    # The document says so too, where a JSON Schema can express the rule.
    assert component("PlanDefinition").is_valid(document) is (case in SCHEMA_BLIND)


async def test_priority_9_0_is_refused_as_written_on_the_wire(running_node, db):
    tenant = await make_tenant(db)
    raw = (
        '{"name":"p","queue_id":"' + tenant.queue_id + '","definition":{"task":{"handler":"h","handler_version":"v1",'
        '"payload_version":"v1","payload":null,"priority":9.0},"schedule":{"interval_s":60}}}'
    ).encode()
    async with running_node.client(tenant.token) as client:
        response = await client.post("/v1/plans", content=raw, headers={"Content-Type": "application/json"})
        error = assert_error(response, 400, "INVALID_ARGUMENT", "definition.task.priority")
        assert "9.0" in error["message"]
        accepted = await client.post(
            "/v1/plans", content=raw.replace(b"9.0", b"9"), headers={"Content-Type": "application/json"}
        )
    assert accepted.status_code == 201


async def test_plan_names_are_unique_per_namespace_and_the_queue_must_exist(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        await new_plan(client, tenant, "daily")
        before = await stored(db)
        again = await client.post("/v1/plans", json={"name": "daily", "queue_id": tenant.queue_id, "definition": GOOD})
        assert_error(again, 409, "ALREADY_EXISTS", "name")
        missing = await client.post("/v1/plans", json={"name": "other", "queue_id": "0" * 32, "definition": GOOD})
        assert_error(missing, 404, "NOT_FOUND", "queue_id")
        assert_error(
            await client.post("/v1/plans", json={"name": "", "queue_id": tenant.queue_id}),
            400,
            "INVALID_ARGUMENT",
            "name",
        )
        assert_error(await client.post("/v1/plans", json={"name": "n"}), 400, "INVALID_ARGUMENT", "queue_id")
    assert await stored(db) == before


async def test_versions_cannot_be_changed_or_removed(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        plan = await new_plan(client, tenant)
        path = f"/v1/plans/{plan['plan_id']}/versions/1"
        for method in ("PUT", "PATCH", "DELETE"):
            response = await client.request(method, path, json={"definition": definition(priority=1, interval_s=60)})
            assert_error(response, 405, "METHOD_NOT_ALLOWED", "method")
        assert (await client.get(path)).json()["data"]["definition"] == GOOD
        assert_error(await client.get(f"/v1/plans/{plan['plan_id']}/versions/x1"), 400, "INVALID_ARGUMENT", "version")
        assert_error(await client.get(f"/v1/plans/{plan['plan_id']}/versions/2"), 404, "NOT_FOUND", "version")
        response = await client.post(f"/v1/plans/{plan['plan_id']}/activate", json={"version": 2})
        assert_error(response, 404, "NOT_FOUND", "version")
        response = await client.post(f"/v1/plans/{plan['plan_id']}/activate", json={"version": "1"})
        assert_error(response, 400, "INVALID_ARGUMENT", "version")


def plan_routes(plan_id: str, queue_id: str) -> list[tuple[str, str, str, dict]]:
    """(method, path, the scope it needs, request kwargs) for every plan route."""
    return [
        ("POST", "/v1/plans", "queues:manage", {"json": {"name": "matrix", "queue_id": queue_id, "definition": GOOD}}),
        ("GET", "/v1/plans", "tasks:read", {}),
        ("GET", f"/v1/plans/{plan_id}", "tasks:read", {}),
        ("POST", f"/v1/plans/{plan_id}/versions", "queues:manage", {"json": {"definition": GOOD}}),
        ("GET", f"/v1/plans/{plan_id}/versions", "tasks:read", {}),
        ("GET", f"/v1/plans/{plan_id}/versions/1", "tasks:read", {}),
        ("POST", f"/v1/plans/{plan_id}/activate", "queues:manage", {"json": {"version": 1}}),
        ("POST", f"/v1/plans/{plan_id}/pause", "queues:manage", {}),
        ("POST", f"/v1/plans/{plan_id}/resume", "queues:manage", {}),
        ("GET", f"/v1/plans/{plan_id}/tasks", "tasks:read", {}),
    ]


ROUTE_IDS = [
    "create",
    "list",
    "get",
    "add-version",
    "list-versions",
    "get-version",
    "activate",
    "pause",
    "resume",
    "tasks",
]


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
async def test_every_plan_route_without_exactly_its_scope_is_403(running_node, db, index):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        plan = await new_plan(client, tenant)
    method, path, needed, kwargs = plan_routes(plan["plan_id"], tenant.queue_id)[index]
    token = await make_token(db, tenant, {scope: "*" for scope in SCOPES if scope != needed})
    before = await stored(db)
    async with running_node.client(token) as client:
        response = await client.request(method, path, **kwargs)
        assert_error(response, 403, "PERMISSION_DENIED", "authorization")
    assert await stored(db) == before
    # A grant for another queue only is not enough either ...
    other_queue = (await make_tenant(db, queues=("q1", "q2"))).queues["q2"]
    token = await make_token(db, tenant, {needed: [other_queue]})
    async with running_node.client(token) as client:
        response = await client.request(method, path, **kwargs)
        if path == "/v1/plans" and method == "GET":
            # ... a listing then shows only what the grant covers: nothing.
            assert response.status_code == 200 and response.json()["data"] == []
        else:
            assert_error(response, 403, "PERMISSION_DENIED", "authorization")
    # ... and the same request with only that scope passes (so the 403 was about the scope).
    token = await make_token(db, tenant, {needed: [tenant.queue_id]})
    async with running_node.client(token) as client:
        response = await client.request(method, path, **kwargs)
    assert response.status_code in (200, 201), response.text


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
async def test_another_tenants_plan_is_404(running_node, db, index):
    owner = await make_tenant(db)
    stranger = await make_tenant(db, "stranger")
    async with running_node.client(owner.token) as client:
        plan = await new_plan(client, owner)
    method, path, _, kwargs = plan_routes(plan["plan_id"], owner.queue_id)[index]
    before = await stored(db)
    async with running_node.client(stranger.token) as client:
        response = await client.request(method, path, **kwargs)
    if path == "/v1/plans" and method == "GET":
        assert response.status_code == 200 and response.json()["data"] == []
        return
    assert_error(response, 404, "NOT_FOUND", "queue_id" if path == "/v1/plans" else "plan_id")
    assert owner.application_id not in response.text
    assert await stored(db) == before
    async with running_node.client(owner.token) as client:
        assert (await client.get(f"/v1/plans/{plan['plan_id']}")).json()["data"] == plan


async def test_queue_scoped_reads_list_only_the_plans_of_those_queues(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        in_a = await client.post("/v1/plans", json={"name": "pa", "queue_id": tenant.queues["a"], "definition": GOOD})
        in_b = await client.post("/v1/plans", json={"name": "pb", "queue_id": tenant.queues["b"], "definition": GOOD})
    token = await make_token(db, tenant, {"tasks:read": [tenant.queues["a"]]})
    async with running_node.client(token) as client:
        listed = (await client.get("/v1/plans")).json()["data"]
        assert [p["plan_id"] for p in listed] == [in_a.json()["data"]["plan_id"]]
        response = await client.get("/v1/plans", params={"queue_id": tenant.queues["b"]})
        assert_error(response, 403, "PERMISSION_DENIED", "authorization")
        assert_error(
            await client.get(f"/v1/plans/{in_b.json()['data']['plan_id']}"), 403, "PERMISSION_DENIED", "authorization"
        )
