"""Retry, bulk cancel and bulk retry by filter, filtered listings and waiting reasons, over
real HTTP against a real node and MariaDB (docs/api.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

import trio

from ..nodeutil import assert_error, make_tenant, make_token
from .test_api_tasks import parse_time, set_columns, submit, task_row
from .test_dispatch_explain import connect_worker

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def ids(document: dict) -> list[str]:
    return [t["task_id"] for t in document["data"]]


async def fail(db, task_id: str) -> None:
    """Play the dispatch side: the task ended failed."""
    await set_columns(db, task_id, "state = 'failed', attempts = max_attempts, finished_at = NOW(6)")


async def listing(client, **params) -> dict:
    response = await client.get("/v1/tasks", params=params)
    assert response.status_code == 200, response.text
    return response.json()


# -- retry ------------------------------------------------------------------------------


async def test_a_retry_is_a_new_linked_task_and_retrying_again_answers_the_same_one(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        original = await submit(
            client,
            tenant.queue_id,
            "k",
            payload={"n": 123456789012345678901234567890},
            priority=7,
            max_attempts=5,
            backoff={"initial_ms": 10, "max_ms": 20, "multiplier": 1.5},
            resource_key="res",
            deadline="2099-01-01T00:00:00Z",
            handler_version="v2",
        )
        await fail(db, original["task_id"])
        first = await client.post(f"/v1/tasks/{original['task_id']}/retry")
        assert first.status_code == 201, first.text
        retry = first.json()["data"]
        assert retry["retried_from"] == original["task_id"] and retry["task_id"] != original["task_id"]
        assert retry["state"] == "queued" and retry["attempts"] == 0 and retry["finished_at"] is None
        for field in ("queue_id", "handler", "handler_version", "payload_version", "priority", "max_attempts"):
            assert retry[field] == original[field], field
        assert retry["backoff"] == original["backoff"] and retry["resource_key"] == "res"
        assert '"n":123456789012345678901234567890' in first.text.replace(" ", "")
        # Due at once; the original's time from acceptance to deadline, counted from the retry.
        assert retry["available_at"] == retry["created_at"]
        budget = parse_time(original["deadline"]) - parse_time(original["created_at"])
        assert parse_time(retry["deadline"]) - parse_time(retry["created_at"]) == budget

        again = await client.post(f"/v1/tasks/{original['task_id']}/retry", json={})
        assert again.status_code == 200 and again.json()["data"]["task_id"] == retry["task_id"]
        # The original keeps its one terminal state.
        old = (await client.get(f"/v1/tasks/{original['task_id']}")).json()["data"]
        assert old["state"] == "failed" and old["retried_from"] is None
    assert (await task_row(db, retry["task_id"]))["retried_from"] == original["task_id"]


async def test_concurrent_retries_of_one_task_create_one_task(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(client, tenant.queue_id, "k")
        await client.post(f"/v1/tasks/{task['task_id']}/cancel")
        answers: list = []

        async def retry():
            answers.append(await client.post(f"/v1/tasks/{task['task_id']}/retry"))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(retry)
    assert sorted(a.status_code for a in answers) == [200] * 9 + [201]
    assert len({a.json()["data"]["task_id"] for a in answers}) == 1
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM tasks WHERE retried_from IS NOT NULL"))
    assert rows[0]["n"] == 1


async def test_a_task_that_succeeded_or_has_not_finished_cannot_be_retried(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        task = await submit(client, tenant.queue_id, "k")
        for state in ("queued", "reserved", "running", "succeeded"):
            await set_columns(db, task["task_id"], "state = %s", state)
            refused = await client.post(f"/v1/tasks/{task['task_id']}/retry")
            error = assert_error(refused, 409, "FAILED_PRECONDITION", "task_id")
            assert state in error["message"] or "succeeded" in error["message"]
        assert_error(await client.post("/v1/tasks/" + "0" * 32 + "/retry"), 404, "NOT_FOUND", "task_id")
        assert_error(await client.post("/v1/tasks/xyz/retry"), 400, "INVALID_ARGUMENT", "task_id")
        await fail(db, task["task_id"])
        assert_error(
            await client.post(f"/v1/tasks/{task['task_id']}/retry", json={"now": True}), 400, "INVALID_ARGUMENT", "now"
        )
    assert (await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM tasks")))[0]["n"] == 1


async def test_scopes_decide_who_retries_and_cancels(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    read_only = await make_token(db, tenant, {"tasks:read": "*"})
    only_a = await make_token(db, tenant, {"tasks:submit": [tenant.queues["a"]], "tasks:cancel": [tenant.queues["a"]]})
    async with running_node.client(tenant.token) as client:
        in_a = await submit(client, tenant.queues["a"], "a")
        in_b = await submit(client, tenant.queues["b"], "b")
    for task in (in_a, in_b):
        await fail(db, task["task_id"])
    async with running_node.client(read_only) as client:
        assert_error(await client.post(f"/v1/tasks/{in_a['task_id']}/retry"), 403, "PERMISSION_DENIED", "authorization")
        for route in ("/v1/tasks/bulk-cancel", "/v1/tasks/bulk-retry"):
            refused = await client.post(route, json={"filter": {"state": "failed"}})
            assert_error(refused, 403, "PERMISSION_DENIED", "authorization")
    async with running_node.client(only_a) as client:
        assert_error(await client.post(f"/v1/tasks/{in_b['task_id']}/retry"), 403, "PERMISSION_DENIED", "authorization")
        outside = await client.post("/v1/tasks/bulk-retry", json={"filter": {"queue_id": tenant.queues["b"]}})
        assert_error(outside, 403, "PERMISSION_DENIED", "authorization")
        # A bulk action takes only the queues the grant covers.
        bulk = (await client.post("/v1/tasks/bulk-retry", json={"filter": {"state": "failed"}})).json()["data"]
        assert [r["task_id"] for r in bulk["results"]] == [in_a["task_id"]] and bulk["changed"] == 1


# -- bulk actions -----------------------------------------------------------------------


async def test_bulk_cancel_pages_by_cursor_until_done_and_a_second_run_changes_nothing(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        wanted = [(await submit(client, tenant.queue_id, f"x{i}", handler="export"))["task_id"] for i in range(23)]
        others = [(await submit(client, tenant.queue_id, f"y{i}", handler="import"))["task_id"] for i in range(3)]
        await set_columns(db, wanted[0], "state = 'running', reserved_at = NOW(6), started_at = NOW(6)")
        body = {"filter": {"handler": "export"}, "limit": 10}
        counts, seen, cursor = [], [], None
        while True:
            answer = await client.post("/v1/tasks/bulk-cancel", json={**body, "cursor": cursor})
            assert answer.status_code == 200, answer.text
            document = answer.json()
            counts.append(document["data"]["changed"])
            seen += [r["task_id"] for r in document["data"]["results"]]
            cursor = document["next_cursor"]
            if cursor is None:
                break
        assert counts == [10, 10, 3] and seen == wanted[::-1]
        after = await listing(client, handler="export", limit=100)
        states = {t["task_id"]: (t["state"], t["cancel_requested"]) for t in after["data"]}
        assert states[wanted[0]] == ("running", True)
        assert all(states[t] == ("cancelled", True) for t in wanted[1:])
        assert {t["state"] for t in (await listing(client, handler="import"))["data"]} == {"queued"}
        # Again: the cancelled ones no longer match; the running one is asked already.
        again = (await client.post("/v1/tasks/bulk-cancel", json=body)).json()
        assert again["data"]["changed"] == 0 and again["next_cursor"] is None
        assert [(r["task_id"], r["outcome"]) for r in again["data"]["results"]] == [(wanted[0], "unchanged")]
    assert len(others) == 3


async def test_a_refused_task_never_stops_the_others(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as client:
        done, waiting, failed = [(await submit(client, tenant.queue_id, k))["task_id"] for k in ("a", "b", "c")]
        await set_columns(db, done, "state = 'succeeded', finished_at = NOW(6)")
        await fail(db, failed)
        body = {"filter": {"task_ids": [done, waiting, failed, "f" * 32]}}
        cancel = (await client.post("/v1/tasks/bulk-cancel", json=body)).json()["data"]
        assert (cancel["changed"], cancel["unchanged"], cancel["refused"]) == (1, 0, 2)
        results = {r["task_id"]: r for r in cancel["results"]}
        assert results[waiting]["outcome"] == "cancelled" and results[waiting]["state"] == "cancelled"
        assert results[done]["outcome"] == "refused" and results[done]["error"]["code"] == "FAILED_PRECONDITION"
        assert results[done]["error"]["field"] == "task_id" and "succeeded" in results[done]["error"]["message"]
        retry = (await client.post("/v1/tasks/bulk-retry", json=body)).json()["data"]
        assert (retry["changed"], retry["unchanged"], retry["refused"]) == (2, 0, 1)
        retried = {r["task_id"]: r.get("retry_task_id") for r in retry["results"] if r["outcome"] == "retried"}
        assert set(retried) == {waiting, failed}
        for old, new in retried.items():
            assert (await client.get(f"/v1/tasks/{new}")).json()["data"]["retried_from"] == old


async def test_bulk_retry_retries_what_failed_once(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        failed_a = [(await submit(client, tenant.queues["a"], f"a{i}"))["task_id"] for i in range(4)]
        failed_b = (await submit(client, tenant.queues["b"], "b"))["task_id"]
        queued_a = (await submit(client, tenant.queues["a"], "q"))["task_id"]
        for task_id in (*failed_a, failed_b):
            await fail(db, task_id)
        body = {"filter": {"queue_id": tenant.queues["a"]}, "limit": 3}
        first = (await client.post("/v1/tasks/bulk-retry", json=body)).json()
        second = (await client.post("/v1/tasks/bulk-retry", json={**body, "cursor": first["next_cursor"]})).json()
        assert first["data"]["changed"] == 3 and second["data"]["changed"] == 1 and second["next_cursor"] is None
        # Only failed, cancelled or expired tasks unless states are named: not the queued one.
        took = [r["task_id"] for r in first["data"]["results"] + second["data"]["results"]]
        assert took == failed_a[::-1] and queued_a not in took
        again = (await client.post("/v1/tasks/bulk-retry", json=body)).json()["data"]
        assert (again["changed"], again["unchanged"]) == (0, 3)
        retries = await listing(client, queue_id=tenant.queues["a"], state="queued")
        assert sorted(t["retried_from"] for t in retries["data"] if t["retried_from"]) == sorted(failed_a)


# -- listing filters --------------------------------------------------------------------


async def test_every_filter_narrows_the_list(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        t = {}
        t["a0"] = await submit(client, tenant.queues["a"], "a0", handler="h1", priority=0)
        t["a5"] = await submit(client, tenant.queues["a"], "a5", handler="h2", priority=5)
        t["a9"] = await submit(client, tenant.queues["a"], "a9", handler="h1", priority=9)
        t["b3"] = await submit(client, tenant.queues["b"], "b3", handler="h2", priority=3)
        t["b7"] = await submit(client, tenant.queues["b"], "b7", handler="h1", priority=7)
        await fail(db, t["a5"]["task_id"])
        await set_columns(db, t["b3"]["task_id"], "state = 'succeeded', finished_at = NOW(6) + INTERVAL 1 HOUR")
        tid = {name: task["task_id"] for name, task in t.items()}

        def named(document):
            by_id = {v: k for k, v in tid.items()}
            return [by_id[i] for i in ids(document)]

        assert named(await listing(client)) == ["b7", "b3", "a9", "a5", "a0"]
        assert named(await listing(client, queue_id=tenant.queues["b"])) == ["b7", "b3"]
        assert named(await listing(client, state="failed,succeeded")) == ["b3", "a5"]
        repeated = await client.get("/v1/tasks", params=[("state", "failed"), ("state", "queued")])
        assert named(repeated.json()) == ["b7", "a9", "a5", "a0"]
        assert named(await listing(client, handler="h2")) == ["b3", "a5"]
        assert named(await listing(client, priority="0,9")) == ["a9", "a0"]
        assert named(await listing(client, priority_min=3, priority_max=7)) == ["b7", "b3", "a5"]
        assert named(await listing(client, priority_min=6)) == ["b7", "a9"]
        middle = t["a9"]["created_at"]
        assert named(await listing(client, created_after=middle)) == ["b7", "b3", "a9"]
        assert named(await listing(client, created_before=middle)) == ["a5", "a0"]
        in_an_hour = (datetime.utcnow() + timedelta(minutes=30)).strftime(TIME_FORMAT)
        assert named(await listing(client, finished_after=in_an_hour)) == ["b3"]
        assert named(await listing(client, finished_before=in_an_hour)) == ["a5"]
        assert named(await listing(client, task_ids=f"{tid['a0']},{tid['b7']}")) == ["b7", "a0"]
        # All given filters hold at once, and pages follow the same filters.
        assert named(await listing(client, handler="h1", state="queued", priority_min=1)) == ["b7", "a9"]
        first = await listing(client, handler="h1", limit=2)
        assert named(first) == ["b7", "a9"] and first["next_cursor"] is not None
        rest = await listing(client, handler="h1", limit=2, cursor=first["next_cursor"])
        assert named(rest) == ["a0"] and rest["next_cursor"] is None


async def test_strict_input_names_the_field(running_node, db):
    tenant = await make_tenant(db)
    bad_queries = [
        ({"colour": "blue"}, "colour"),
        ({"state": "done"}, "state"),
        ({"state": "queued,"}, "state"),
        ({"priority": "10"}, "priority"),
        ({"priority": "1.0"}, "priority"),
        ({"priority_min": "5", "priority_max": "4"}, "priority_max"),
        ({"handler": "has space"}, "handler"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_after": "2030-01-02T00:00:00Z", "created_before": "2030-01-01T00:00:00Z"}, "created_before"),
        ({"finished_before": "2030-13-01T00:00:00Z"}, "finished_before"),
        ({"task_ids": "abc"}, "task_ids"),
        ({"queue_id": "Q" * 32}, "queue_id"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ({"limit": "501"}, "limit"),
    ]
    bad_bodies = [
        ({"filter": {"state": "failed"}, "colour": 1}, "colour"),
        ({}, "filter"),
        ({"filter": {}}, "filter"),
        ({"filter": []}, "filter"),
        ({"filter": {"colour": 1}}, "filter.colour"),
        ({"filter": {"state": ["failed", "done"]}}, "filter.state[1]"),
        ({"filter": {"state": []}}, "filter.state"),
        ({"filter": {"priority": 9.0}}, "filter.priority"),
        ({"filter": {"priority": [1, "2"]}}, "filter.priority[1]"),
        ({"filter": {"task_ids": "f" * 32}}, "filter.task_ids"),
        ({"filter": {"task_ids": ["f" * 31]}}, "filter.task_ids[0]"),
        ({"filter": {"task_ids": ["f" * 32] * 1001}}, "filter.task_ids"),
        ({"filter": {"created_before": 5}}, "filter.created_before"),
        ({"filter": {"state": "failed"}, "limit": 0}, "limit"),
        ({"filter": {"state": "failed"}, "limit": 1001}, "limit"),
        ({"filter": {"state": "failed"}, "cursor": "x"}, "cursor"),
    ]
    async with running_node.client(tenant.token) as client:
        for params, field in bad_queries:
            assert_error(await client.get("/v1/tasks", params=params), 400, "INVALID_ARGUMENT", field)
        repeated = await client.get("/v1/tasks", params=[("handler", "a"), ("handler", "b")])
        assert_error(repeated, 400, "INVALID_ARGUMENT", "handler")
        for route in ("/v1/tasks/bulk-cancel", "/v1/tasks/bulk-retry"):
            for body, field in bad_bodies:
                assert_error(await client.post(route, json=body), 400, "INVALID_ARGUMENT", field)
            missing = await client.post(route, json={"filter": {"queue_id": "0" * 32}})
            assert_error(missing, 404, "NOT_FOUND", "queue_id")


# -- waiting reasons ---------------------------------------------------------------------


async def test_queued_tasks_say_why_they_wait(running_node, db):
    tenant = await make_tenant(db, queues=("a", "b"))
    async with running_node.client(tenant.token) as client:
        nobody = await submit(client, tenant.queues["a"], "nobody", handler="unserved")
        later = await submit(client, tenant.queues["a"], "later", delay_s=3600)
        due = await submit(client, tenant.queues["a"], "due")
        done = await submit(client, tenant.queues["a"], "done")
        in_b = await submit(client, tenant.queues["b"], "paused")
        await set_columns(db, done["task_id"], "state = 'succeeded', finished_at = NOW(6)")
        before = {t["task_id"]: t["waiting_reason"] for t in (await listing(client))["data"]}
        assert set(before.values()) == {"NO_CAPABLE_WORKER", None}
        assert before[done["task_id"]] is None

        # A Worker serving handler h of both queues (the registry row a node writes).
        await connect_worker(
            db, tenant, capabilities=(("object.prepare", "v1", "v1"),), queues=list(tenant.queues.values())
        )
        await client.post(f"/v1/queues/{tenant.queues['b']}/pause")
        reasons = {t["task_id"]: t["waiting_reason"] for t in (await listing(client))["data"]}
        assert reasons == {
            nobody["task_id"]: "NO_CAPABLE_WORKER",
            later["task_id"]: "NOT_DUE",
            due["task_id"]: None,
            done["task_id"]: None,
            in_b["task_id"]: "QUEUE_PAUSED",
        }
        await client.patch(f"/v1/queues/{tenant.queues['a']}/controls", json={"max_concurrency": 0})
        capped = {
            t["task_id"]: t["waiting_reason"] for t in (await listing(client, queue_id=tenant.queues["a"]))["data"]
        }
        assert capped[due["task_id"]] == "QUOTA" and capped[later["task_id"]] == "NOT_DUE"
        # The explanation of the same task gives every reason.
        explained = (await client.get(f"/v1/tasks/{due['task_id']}/explain")).json()["data"]
        assert [r["code"] for r in explained["reasons"]] == ["QUEUE_CONCURRENCY_FULL"]
