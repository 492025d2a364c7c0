"""schema/openapi.yaml and the running app agree: the same routes and methods, and real
responses (successes and errors) validate against the documented schemas."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from orbit_node.api.app import create_app
from orbit_node.api.state import NodeState
from orbit_node.config import NodeConfig
from orbit_node.db import Database
from orbit_node.domain.dsn import Dsn

from ..helpers import REPO
from ..nodeutil import make_tenant, make_token

DOCUMENT = yaml.safe_load((REPO / "schema" / "openapi.yaml").read_text())
BASE_URI = "urn:orbit:openapi"
REGISTRY = Registry().with_resource(BASE_URI, Resource.from_contents(DOCUMENT, default_specification=DRAFT202012))
# Methods the framework answers on its own (HEAD for every GET); not separate operations.
IMPLICIT_METHODS = {"HEAD", "OPTIONS"}
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def resolve(node: dict) -> dict:
    """Follow an OpenAPI ``$ref`` inside the document (responses, parameters)."""
    while "$ref" in node:
        pointer = node["$ref"].removeprefix("#/").split("/")
        node = DOCUMENT
        for part in pointer:
            node = node[part]
    return node


def schema_validator(schema: dict) -> Draft202012Validator:
    return Draft202012Validator(_rebase(schema), registry=REGISTRY)


def _rebase(schema: Any) -> Any:
    """Point the document's local refs at the registered document."""
    if isinstance(schema, dict):
        return {k: (f"{BASE_URI}{v}" if k == "$ref" and v.startswith("#/") else _rebase(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rebase(v) for v in schema]
    return schema


def component(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{BASE_URI}#/components/schemas/{name}"}, registry=REGISTRY)


def documented_routes(*, websocket: bool) -> dict[str, set[str]]:
    return {
        path: {m.upper() for m in item if m in HTTP_METHODS}
        for path, item in DOCUMENT["paths"].items()
        if bool(item.get("x-orbit-websocket")) == websocket
    }


def app_routes(app) -> tuple[dict[str, set[str]], set[str]]:
    http: dict[str, set[str]] = {}
    websockets: set[str] = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/console"):
            continue  # the console's HTML pages are not part of the API (docs/operations.md)
        path = re.sub(r"<(?:[a-z_]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        if getattr(rule, "websocket", False):
            websockets.add(path)
        else:
            http.setdefault(path, set()).update(set(rule.methods) - IMPLICIT_METHODS)
    return http, websockets


def test_the_document_is_openapi_3_1_with_valid_schemas():
    assert DOCUMENT["openapi"] == "3.1.0"
    for schema in DOCUMENT["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    # Every operation documents its success and at least the auth failures.
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            statuses = set(operation["responses"])
            assert statuses & {"200", "201", "101"}, (method, path)
            if path.startswith("/v1/"):
                assert {"401", "403"} <= statuses, (method, path)


def test_routes_and_methods_equal_the_document():
    # The factory the node serves (no connection is made to build it).
    config = NodeConfig(dsn=Dsn.parse("mysql://root@127.0.0.1:1/unused"))
    state = NodeState.build(config=config, db=Database(config.dsn, size=1), node_id="0" * 32)
    http, websockets = app_routes(create_app(state))
    assert http == documented_routes(websocket=False)
    # The Worker endpoint is documented once it is routed (its messages live in their own schema).
    assert websockets <= set(documented_routes(websocket=True))


class Checker:
    """Validates responses against the operation the document gives for them."""

    def __init__(self):
        self.seen: set[tuple[str, str, str]] = set()

    def __call__(self, response, template: str) -> dict:
        method = response.request.method.lower()
        operation = DOCUMENT["paths"][template][method]
        status = str(response.status_code)
        assert status in operation["responses"], f"{method.upper()} {template}: undocumented status {status}"
        documented = resolve(operation["responses"][status])
        schema = documented["content"]["application/json"]["schema"]
        body = response.json()
        errors = sorted(schema_validator(schema).iter_errors(body), key=str)
        assert not errors, f"{method.upper()} {template} {status}: {errors[0].message} in {json.dumps(body)[:300]}"
        self.seen.add((method.upper(), template, status))
        return body


async def test_real_responses_match_the_document(running_node, db):
    check = Checker()
    tenant = await make_tenant(db)
    other = await make_tenant(db, "other")
    read_only = await make_token(db, tenant, {"tasks:read": "*"})
    body = {
        "queue_id": tenant.queue_id,
        "handler": "object.prepare",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {"n": 10**30},
        "priority": 9,
        "deadline": "2099-01-01T00:00:00Z",
        "resource_key": "r",
    }
    component("SubmitTaskRequest").validate(body)
    async with running_node.client() as anonymous:
        check(await anonymous.get("/healthz"), "/healthz")
        check(await anonymous.get("/readyz"), "/readyz")
        # ORBIT_METRICS is off here: the path answers like an unknown one.
        check(await anonymous.get("/metrics"), "/metrics")
        check(await anonymous.get("/v1/tasks"), "/v1/tasks")
    async with running_node.client(read_only) as client:
        check(await client.post("/v1/tasks", json=body, headers={"Idempotency-Key": "k"}), "/v1/tasks")
        check(await client.post("/v1/tasks/batch", json={"tasks": [body]}), "/v1/tasks/batch")
        for route in ("/v1/tasks/bulk-cancel", "/v1/tasks/bulk-retry"):
            check(await client.post(route, json={"filter": {"state": "failed"}}), route)
    async with running_node.client(tenant.token) as client:
        created = check(await client.post("/v1/tasks", json=body, headers={"Idempotency-Key": "k"}), "/v1/tasks")
        task_id = created["data"]["task_id"]
        check(await client.post("/v1/tasks", json=body, headers={"Idempotency-Key": "k"}), "/v1/tasks")
        check(
            await client.post("/v1/tasks", json={**body, "priority": 1}, headers={"Idempotency-Key": "k"}), "/v1/tasks"
        )
        check(
            await client.post("/v1/tasks", json={**body, "priority": 10}, headers={"Idempotency-Key": "x"}), "/v1/tasks"
        )
        foreign = {**body, "queue_id": other.queue_id}
        check(await client.post("/v1/tasks", json=foreign, headers={"Idempotency-Key": "y"}), "/v1/tasks")
        items = [
            {**body, "idempotency_key": "k"},
            {**body, "idempotency_key": "k", "priority": 1},
            {**body, "idempotency_key": "b1", "priority": 10},
            {**foreign, "idempotency_key": "b2"},
            {**body, "idempotency_key": "b3"},
        ]
        for item in items[:2] + items[3:]:
            component("SubmitTasksItem").validate(item)
        batch = check(await client.post("/v1/tasks/batch", json={"tasks": items}), "/v1/tasks/batch")
        assert [r["status"] for r in batch["data"]["results"]] == [200, 409, 400, 404, 201]
        minimal = await client.post("/v1/tasks/batch", json={"tasks": items}, headers={"Prefer": "return=minimal"})
        assert [r["status"] for r in check(minimal, "/v1/tasks/batch")["data"]["results"]] == [200, 409, 400, 404, 200]
        check(await client.post("/v1/tasks/batch", json={"tasks": []}), "/v1/tasks/batch")
        check(
            await client.post(
                "/v1/tasks", content=b"{}", headers={"Idempotency-Key": "z", "Content-Type": "text/plain"}
            ),
            "/v1/tasks",
        )
        check(
            await client.post("/v1/tasks", content=b" " * (2 * 1024 * 1024), headers={"Idempotency-Key": "z"}),
            "/v1/tasks",
        )
        plain = {k: v for k, v in body.items() if k not in ("priority", "deadline", "resource_key")}
        plain_id = check(await client.post("/v1/tasks", json=plain, headers={"Idempotency-Key": "plain"}), "/v1/tasks")[
            "data"
        ]["task_id"]
        check(await client.get("/v1/tasks", params={"limit": 1}), "/v1/tasks")
        check(await client.get("/v1/tasks", params={"limit": 0}), "/v1/tasks")
        check(await client.get("/v1/tasks", params={"queue_id": other.queue_id}), "/v1/tasks")
        check(await client.get(f"/v1/tasks/{task_id}"), "/v1/tasks/{task_id}")
        check(await client.get("/v1/tasks/" + "0" * 32), "/v1/tasks/{task_id}")
        check(await client.get("/v1/tasks/xyz"), "/v1/tasks/{task_id}")
        check(await client.get(f"/v1/tasks/{plain_id}/explain"), "/v1/tasks/{task_id}/explain")
        # Dependencies: a child of one task, a batch graph, the children of a parent.
        child = {**plain, "depends_on": [plain_id]}
        component("SubmitTaskRequest").validate(child)
        waiting = check(await client.post("/v1/tasks", json=child, headers={"Idempotency-Key": "child"}), "/v1/tasks")
        assert (waiting["data"]["state"], waiting["data"]["depends_on"]) == ("waiting", [plain_id])
        graph = [{**plain, "idempotency_key": "g1"}, {**plain, "idempotency_key": "g2", "depends_on_keys": ["g1"]}]
        for item in graph:
            component("SubmitTasksItem").validate(item)
        check(await client.post("/v1/tasks/batch", json={"tasks": graph}), "/v1/tasks/batch")
        check(await client.get(f"/v1/tasks/{waiting['data']['task_id']}"), "/v1/tasks/{task_id}")
        check(await client.get(f"/v1/tasks/{waiting['data']['task_id']}/explain"), "/v1/tasks/{task_id}/explain")
        children = check(await client.get(f"/v1/tasks/{plain_id}/children"), "/v1/tasks/{task_id}/children")
        assert children["data"] == [{"task_id": waiting["data"]["task_id"], "state": "waiting"}]
        check(await client.get(f"/v1/tasks/{plain_id}/children", params={"limit": 0}), "/v1/tasks/{task_id}/children")
        check(await client.get(f"/v1/tasks/{task_id}/explain"), "/v1/tasks/{task_id}/explain")
        check(await client.get("/v1/tasks/" + "0" * 32 + "/explain"), "/v1/tasks/{task_id}/explain")
        check(await client.post(f"/v1/tasks/{task_id}/cancel"), "/v1/tasks/{task_id}/cancel")
        await db.run(
            lambda tx: tx.execute_raw(
                "UPDATE tasks SET state = 'succeeded', result = '[1]' WHERE task_id = %s", (task_id,)
            )
        )
        check(await client.post(f"/v1/tasks/{task_id}/cancel"), "/v1/tasks/{task_id}/cancel")
        check(await client.get(f"/v1/tasks/{task_id}"), "/v1/tasks/{task_id}")
        # Retry: refused for a succeeded task, new (201) then the same (200) for a cancelled one.
        check(await client.post(f"/v1/tasks/{task_id}/retry"), "/v1/tasks/{task_id}/retry")
        check(await client.post(f"/v1/tasks/{plain_id}/cancel"), "/v1/tasks/{task_id}/cancel")
        retry = check(await client.post(f"/v1/tasks/{plain_id}/retry"), "/v1/tasks/{task_id}/retry")
        assert retry["data"]["retried_from"] == plain_id
        check(await client.post(f"/v1/tasks/{plain_id}/retry"), "/v1/tasks/{task_id}/retry")
        check(await client.post("/v1/tasks/" + "0" * 32 + "/retry"), "/v1/tasks/{task_id}/retry")
        listed = check(await client.get("/v1/tasks", params={"state": "queued,cancelled"}), "/v1/tasks")
        assert {t["waiting_reason"] for t in listed["data"]} == {"NO_CAPABLE_WORKER", None}
        check(await client.get("/v1/tasks", params={"priority_min": 5, "priority_max": 1}), "/v1/tasks")
        for route in ("/v1/tasks/bulk-cancel", "/v1/tasks/bulk-retry"):
            bulk = {"filter": {"task_ids": [task_id, plain_id]}, "limit": 1}
            component("BulkRequest").validate(bulk)
            first = check(await client.post(route, json=bulk), route)
            check(await client.post(route, json={**bulk, "cursor": first["next_cursor"]}), route)
            check(await client.post(route, json={"filter": {}}), route)
            check(await client.post(route, json={"filter": {"queue_id": other.queue_id}}), route)

        queue = check(await client.post("/v1/queues", json={"name": "second", "max_concurrency": 2}), "/v1/queues")
        queue_id = queue["data"]["queue_id"]
        check(await client.post("/v1/queues", json={"name": "second"}), "/v1/queues")
        check(await client.post("/v1/queues", json={"name": ""}), "/v1/queues")
        check(await client.get("/v1/queues", params={"limit": 1}), "/v1/queues")
        check(await client.get(f"/v1/queues/{queue_id}"), "/v1/queues/{queue_id}")
        check(await client.get(f"/v1/queues/{other.queue_id}"), "/v1/queues/{queue_id}")
        check(await client.post(f"/v1/queues/{queue_id}/pause"), "/v1/queues/{queue_id}/pause")
        check(await client.post(f"/v1/queues/{queue_id}/resume"), "/v1/queues/{queue_id}/resume")
        check(
            await client.patch(f"/v1/queues/{queue_id}/controls", json={"max_concurrency": None}),
            "/v1/queues/{queue_id}/controls",
        )
        check(
            await client.patch(f"/v1/queues/{queue_id}/controls", json={"max_concurrency": -1}),
            "/v1/queues/{queue_id}/controls",
        )
    operations = {(m, p) for m, p, _ in check.seen}
    assert operations == {
        (method, path)
        for path, methods in documented_routes(websocket=False).items()
        for method in methods
        # The plan routes are exercised against the document by tests/integration/test_plans_api.py.
        if not path.startswith("/v1/plans")
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"colour": "blue"},
        {"priority": -1},
        {"priority": 10},
        {"priority": "9"},
        {"priority": True},
        {"priority": None},
        {"max_attempts": 0},
        {"resource_key": ""},
        {"resource_key": "r" * 256},
        {"handler": "has space"},
        {"available_at": "2030-01-01T00:00:00Z", "delay_s": 5},
        {"backoff": {"jitter": 1}},
    ],
)
def test_the_documented_request_schema_refuses_what_the_server_refuses(bad):
    good = {"queue_id": "1" * 32, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": None}
    component("SubmitTaskRequest").validate(good)
    assert not component("SubmitTaskRequest").is_valid({**good, **bad})
