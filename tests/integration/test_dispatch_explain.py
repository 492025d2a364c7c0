"""The explanation query: why a task is not being dispatched right now."""

from __future__ import annotations

import json

import pytest
import trio
from quart import Blueprint

from orbit_node.api import auth, explain
from orbit_node.api.app import create_app
from orbit_node.api.state import NodeState
from orbit_node.domain.errors import NotFound
from orbit_node.store.tenancy import TenancyStore

from ..seed import NODE, TaskSpec, claim_request, insert_task, insert_tasks, lease_store, tenant


def codes(explanation):
    return [r["code"] for r in explanation["reasons"]]


async def connect_worker(db, owner, *, capabilities=(("h", "v1", "v1"),), resource_keys=False, queues=None):
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO worker_connections (connection_id, node_id, namespace_id, queues, capabilities, "
            "resource_key_support) VALUES (%s, %s, %s, %s, %s, %s)",
            (
                "conn-" + str(len(capabilities)) + str(resource_keys),
                "9" * 32,
                owner.namespace_id,
                json.dumps(list(queues or [owner.queue_id])),
                json.dumps([list(c) for c in capabilities]),
                int(resource_keys),
            ),
        )
    )


async def test_a_dispatchable_task_reports_its_position(db):
    owner = await tenant(db)
    await connect_worker(db, owner)
    first, other_handler, task = await insert_tasks(
        db,
        owner,
        [
            TaskSpec(available_in_s=-50),
            TaskSpec(available_in_s=-45, handler="g"),
            TaskSpec(available_in_s=-10, priority=1),
        ],
    )
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    assert explanation["dispatchable"] is True and explanation["reasons"] == []
    assert explanation["capable_connections"] == 1
    assert explanation["position"] == {
        "order": ["dispatch_at", "available_at", "task_id"],
        "due_tasks_ahead": 2,
        "due_tasks_ahead_same_capability": 1,
        "capped": False,
    }
    assert explanation["priority"] == 1 and explanation["state"] == "queued"
    # dispatch_at = available_at - 30 s, as RFC 3339 text.
    assert explanation["dispatch_at"].endswith("Z")
    json.dumps(explanation)  # JSON-ready
    ahead = await lease_store(db).explain(owner.namespace_id, first)
    assert ahead["position"]["due_tasks_ahead"] == 0


async def test_position_count_is_capped(db, monkeypatch):
    from orbit_node.store import explain as store_explain

    monkeypatch.setattr(store_explain, "POSITION_CAP", 3)
    owner = await tenant(db)
    *_, last = await insert_tasks(db, owner, [TaskSpec(available_in_s=-10 + i) for i in range(6)])
    position = (await lease_store(db).explain(owner.namespace_id, last))["position"]
    assert (position["due_tasks_ahead"], position["capped"]) == (3, True)


async def test_not_due_and_no_capable_worker(db):
    owner = await tenant(db)
    await connect_worker(db, owner, capabilities=(("h", "v2", "v1"),))
    task = await insert_task(db, owner, available_in_s=120)
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    assert codes(explanation) == ["NOT_DUE", "NO_CAPABLE_WORKER"]
    assert 119 < explanation["reasons"][0]["due_in_s"] <= 120
    assert explanation["position"] is None and explanation["capable_connections"] == 0


async def test_gates_quotas_and_rate(db):
    owner = await tenant(db, max_concurrency=1, max_starts_per_second=5)
    await connect_worker(db, owner)
    running, waiting = await insert_tasks(db, owner, [TaskSpec(available_in_s=-2), TaskSpec(available_in_s=-1)])
    tenancy = TenancyStore(db)
    await tenancy.set_application_quota(owner.application_id, max_concurrent_executions=1, max_starts_per_second=None)
    await lease_store(db).claim(claim_request(owner, limit=1))
    await tenancy.set_queue_paused(owner.namespace_id, owner.queue_id, True)
    await tenancy.set_application_suspended(owner.application_id, True)
    await db.run(
        lambda tx: tx.execute_raw("UPDATE queues SET start_window_s = UNIX_TIMESTAMP() + 60, start_window_count = 5")
    )
    explanation = await lease_store(db).explain(owner.namespace_id, waiting)
    assert codes(explanation) == [
        "QUEUE_PAUSED",
        "APPLICATION_SUSPENDED",
        "APPLICATION_CONCURRENCY_FULL",
        "QUEUE_CONCURRENCY_FULL",
        "QUEUE_START_RATE_EXHAUSTED",
    ]
    full = explanation["reasons"][2]
    assert (full["live"], full["limit"]) == (1, 1)


async def test_resource_key_held_by_another_task(db):
    owner = await tenant(db)
    await connect_worker(db, owner, resource_keys=False)
    holder, waiting = await insert_tasks(
        db, owner, [TaskSpec(available_in_s=-2, resource_key="k"), TaskSpec(available_in_s=-1, resource_key="k")]
    )
    (r,) = await lease_store(db).claim(claim_request(owner, resource_key_support=True))
    assert r.task_id == holder
    explanation = await lease_store(db).explain(owner.namespace_id, waiting)
    assert codes(explanation) == ["RESOURCE_KEY_HELD", "NO_CAPABLE_WORKER"]
    assert explanation["reasons"][0]["holder_task_id"] == holder
    assert "resource-key support" in explanation["reasons"][1]["message"]


async def test_settlement_pending_reasons(db):
    owner = await tenant(db)
    await connect_worker(db, owner)
    task = await insert_task(
        db, owner, available_in_s=-5, deadline_in_s=-1, attempts=3, max_attempts=3, cancel_requested=True
    )
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    assert codes(explanation) == ["CANCEL_REQUESTED", "DEADLINE_PASSED", "OUT_OF_ATTEMPTS"]


async def register(db, owner, connection_id: str, *, node_id: str = NODE, heartbeat_ago_s: float = 0.0) -> None:
    """The node (heartbeat ``heartbeat_ago_s`` ago) and its connection, as the registry has them."""
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO nodes (node_id, hostname, http_addr, version, heartbeat_at) "
            "VALUES (%s, 'h', 'a', 'v', NOW(6) - INTERVAL %s SECOND)",
            (node_id, heartbeat_ago_s),
        )
    )
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO worker_connections (connection_id, node_id, namespace_id, queues, capabilities) "
            "VALUES (%s, %s, %s, %s, %s)",
            (connection_id, node_id, owner.namespace_id, json.dumps([owner.queue_id]), json.dumps([["h", "v1", "v1"]])),
        )
    )


async def test_a_reserved_task_names_its_owner_and_lease(db):
    owner = await tenant(db)
    await register(db, owner, "conn-7")
    task = await insert_task(db, owner, available_in_s=-1)
    (r,) = await lease_store(db).claim(claim_request(owner, connection_id="conn-7"))
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    (reason,) = explanation["reasons"]
    assert reason["code"] == "NOT_QUEUED" and explanation["state"] == "reserved"
    assert reason["connection_id"] == "conn-7"
    assert reason["lease_expires_at"] == r.lease_expires_at.isoformat(timespec="microseconds") + "Z"


async def test_a_running_task_whose_connection_closed_says_when_its_lease_runs_out(db):
    owner = await tenant(db)
    await register(db, owner, "conn-other")  # the node is live; conn-8 is not registered
    task = await insert_task(db, owner, available_in_s=-1, max_attempts=3)
    (r,) = await lease_store(db).claim(claim_request(owner, connection_id="conn-8"))
    await lease_store(db).start_many([(task, r.fencing_token)])
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    assert codes(explanation) == ["NOT_QUEUED", "WORKER_GONE"]
    gone = explanation["reasons"][1]
    assert gone["connection_id"] == "conn-8" and 55 <= gone["lease_left_s"] <= 60
    assert "its Worker's connection conn-8 closed" in gone["message"]
    assert "back to its queue for attempt 2 of 3" in gone["message"]
    assert "unless its Worker reconnects first and re-attaches the task" in gone["message"]


async def test_a_task_whose_node_stopped_answering_names_the_node_and_its_last_heartbeat(db):
    owner = await tenant(db)
    await register(db, owner, "conn-9", heartbeat_ago_s=120)
    task = await insert_task(db, owner, available_in_s=-1, max_attempts=1)
    (r,) = await lease_store(db).claim(claim_request(owner, connection_id="conn-9"))
    explanation = await lease_store(db).explain(owner.namespace_id, task)
    assert codes(explanation) == ["NOT_QUEUED", "WORKER_GONE"]
    message = explanation["reasons"][1]["message"]
    assert f"its node {NODE} last answered at" in message
    assert "the reservation runs out at" in message and "goes back to its queue" in message


async def test_unknown_and_foreign_tasks_are_not_found(db):
    owner = await tenant(db)
    stranger = await tenant(db, application="other")
    foreign = await insert_task(db, stranger)
    store = lease_store(db)
    for task_id in (foreign, "0" * 32, "not-an-id"):
        with pytest.raises(NotFound):
            await store.explain(owner.namespace_id, task_id)


async def test_http_route_needs_tasks_read_and_hides_other_tenants(db, node_config):
    owner = await tenant(db)
    stranger = await tenant(db, application="other")
    task = await insert_task(db, owner, available_in_s=-1)
    foreign = await insert_task(db, stranger, available_in_s=-1)
    tenancy = TenancyStore(db)
    _, reader = await tenancy.create_credential(owner.namespace_id, "reader", {"tasks:read": "*"})
    _, submitter = await tenancy.create_credential(owner.namespace_id, "submitter", {"tasks:submit": "*"})
    _, other_queue = await tenancy.create_credential(owner.namespace_id, "narrow", {"tasks:read": ["a" * 32]})

    app = create_app(NodeState.build(config=node_config, db=db, node_id="n" * 32))
    v1 = Blueprint("v1_explain", __name__, url_prefix="/v1")
    v1.before_request(auth.authenticate)
    v1.register_blueprint(explain.blueprint)
    app.register_blueprint(v1)

    async def get(path, token):
        async with app.test_app() as test_app:
            response = await test_app.test_client().get(path, headers={"Authorization": f"Bearer {token}"})
            return response.status_code, await response.get_json()

    with trio.fail_after(30):
        status, body = await get(f"/v1/tasks/{task}/explain", reader)
        assert status == 200 and body["data"]["task_id"] == task
        assert codes(body["data"]) == ["NO_CAPABLE_WORKER"]
        assert (await get(f"/v1/tasks/{foreign}/explain", reader))[0] == 404
        assert (await get(f"/v1/tasks/{task}/explain", submitter))[0] == 403
        assert (await get(f"/v1/tasks/{task}/explain", other_queue))[0] == 403
        status, body = await get("/v1/tasks/xyz/explain", reader)
        assert (status, body["error"]["field"]) == (400, "task_id")
        assert (await get(f"/v1/tasks/{task}/explain", "orb_bad"))[0] == 401
