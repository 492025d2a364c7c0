"""POST /v1/tasks/batch and OrbitClient.submit_many against a real node and MariaDB.

Each item follows the single submit's rules exactly (its own key, 201/200/409/400/403/404);
whole-request problems refuse the request; the batch is one transaction."""

from __future__ import annotations

import attrs
import httpx
import trio

from ..nodeutil import assert_error, make_tenant, make_token, run_node, stored_counts


def task(queue_id: str, key: str, **extra) -> dict:
    body = {
        "idempotency_key": key,
        "queue_id": queue_id,
        "handler": "object.prepare",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {"object_ref": "objects/example", "n": 2**70},
    }
    body.update(extra)
    return body


async def batch(client: httpx.AsyncClient, items, **kwargs) -> httpx.Response:
    return await client.post("/v1/tasks/batch", json={"tasks": items}, **kwargs)


def results(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    document = response.json()
    assert set(document) == {"data", "request_id"}
    data = document["data"]
    assert [r["index"] for r in data["results"]] == list(range(len(data["results"])))
    statuses = [r["status"] for r in data["results"]]
    assert data["created"] == statuses.count(201)
    assert data["existing"] == statuses.count(200)
    assert data["refused"] == len(statuses) - data["created"] - data["existing"]
    return data["results"]


def item_error(result: dict, status: int, code: str, field: str) -> None:
    assert result["status"] == status, result
    assert set(result) == {"index", "status", "error"}, result
    assert result["error"]["code"] == code, result
    assert result["error"]["field"] == field, result
    assert result["error"]["message"].startswith(field + ": "), result


async def test_created_in_request_order_then_repeated(running_node, db):
    tenant = await make_tenant(db)
    items = [task(tenant.queue_id, f"k{i}", priority=i % 10) for i in range(4)]
    every_field = {
        "available_at": "2030-01-01T01:00:00.123456+01:00",
        "deadline": "2031-01-01T00:00:00Z",
        "max_attempts": 7,
        "backoff": {"initial_ms": 10, "max_ms": 20, "multiplier": 1.1},
        "resource_key": "objects/r",
    }
    items.append(task(tenant.queue_id, "k4", priority=4, **every_field))
    async with running_node.client(tenant.token) as client:
        first = results(await batch(client, items))
        assert [r["status"] for r in first] == [201] * 5
        assert [r["task"].get("priority", 0) for r in first] == [i % 10 for i in range(5)]
        assert first[0]["task"]["payload"]["n"] == 2**70
        # Every task of one batch carries the one database clock reading.
        assert len({r["task"]["created_at"] for r in first}) == 1
        # The answer is the stored task, exactly as a read returns it.
        for result in first:
            fetched = await client.get(f"/v1/tasks/{result['task']['task_id']}")
            assert fetched.json()["data"] == result["task"]
        assert first[4]["task"]["available_at"] == "2030-01-01T00:00:00.123456Z"

        again = results(await batch(client, items))
        assert [r["status"] for r in again] == [200] * 5
        assert [r["task"]["task_id"] for r in again] == [r["task"]["task_id"] for r in first]
    assert await stored_counts(db) == {"tasks": 5, "idempotency_records": 5, "resource_keys": 1}


async def test_keys_are_shared_with_the_single_submit(running_node, db):
    tenant = await make_tenant(db)
    single = {k: v for k, v in task(tenant.queue_id, "x").items() if k != "idempotency_key"}
    async with running_node.client(tenant.token) as client:
        created = await client.post("/v1/tasks", json=single, headers={"Idempotency-Key": "single"})
        assert created.status_code == 201
        got = results(
            await batch(client, [task(tenant.queue_id, "single"), task(tenant.queue_id, "single", priority=2)])
        )
        assert got[0]["status"] == 200 and got[0]["task"] == created.json()["data"]
        item_error(got[1], 409, "IDEMPOTENCY_CONFLICT", "tasks[1].idempotency_key")

        (from_batch,) = results(await batch(client, [task(tenant.queue_id, "batch")]))
        repeat = await client.post("/v1/tasks", json=single, headers={"Idempotency-Key": "batch"})
        assert repeat.status_code == 200 and repeat.json()["data"] == from_batch["task"]
        conflict = await client.post("/v1/tasks", json={**single, "priority": 1}, headers={"Idempotency-Key": "batch"})
        assert_error(conflict, 409, "IDEMPOTENCY_CONFLICT", "Idempotency-Key")


async def test_each_item_is_validated_with_its_field_named_and_good_items_are_accepted(running_node, db):
    tenant = await make_tenant(db)
    q = tenant.queue_id
    no_handler = task(q, "no-handler")
    del no_handler["handler"]
    no_key = task(q, "unused")
    del no_key["idempotency_key"]
    items = [
        task(q, "ok-0"),
        task(q, "bad-priority", priority=10),
        no_handler,
        task(q, "unknown", colour="blue"),
        "not an object",
        task(q, "bad key"),
        no_key,
        task(q, "nested", backoff={"jitter": 1}),
        task(q, "both", delay_s=1, available_at="2030-01-01T00:00:00Z"),
        task("Q" * 32, "queue-id"),
        task(q, "float-priority", priority=9.0),
        task(q, "ok-11", delay_s=2.5),
    ]
    async with running_node.client(tenant.token) as client:
        got = results(await batch(client, items))
    assert got[0]["status"] == 201
    item_error(got[1], 400, "INVALID_ARGUMENT", "tasks[1].priority")
    item_error(got[2], 400, "INVALID_ARGUMENT", "tasks[2].handler")
    item_error(got[3], 400, "INVALID_ARGUMENT", "tasks[3].colour")
    item_error(got[4], 400, "INVALID_ARGUMENT", "tasks[4]")
    item_error(got[5], 400, "INVALID_ARGUMENT", "tasks[5].idempotency_key")
    item_error(got[6], 400, "INVALID_ARGUMENT", "tasks[6].idempotency_key")
    item_error(got[7], 400, "INVALID_ARGUMENT", "tasks[7].backoff.jitter")
    item_error(got[8], 400, "INVALID_ARGUMENT", "tasks[8].delay_s")
    item_error(got[9], 400, "INVALID_ARGUMENT", "tasks[9].queue_id")
    item_error(got[10], 400, "INVALID_ARGUMENT", "tasks[10].priority")  # 9.0 is not an integer literal
    assert got[11]["status"] == 201
    delayed = got[11]["task"]
    assert delayed["available_at"] > delayed["created_at"]
    assert await stored_counts(db) == {"tasks": 2, "idempotency_records": 2, "resource_keys": 0}


async def test_one_key_twice_in_a_batch_answers_like_a_repeat(running_node, db):
    tenant = await make_tenant(db)
    q = tenant.queue_id
    items = [
        task(q, "dup"),
        task(q, "dup"),  # identical: the repeat of item 0
        task(q, "dup", priority=5),  # changed: a conflict
        task(q, "later", priority=10),  # refused: takes no key
        task(q, "later"),  # so this one creates
        task(q, "later"),
    ]
    async with running_node.client(tenant.token) as client:
        got = results(await batch(client, items))
    assert [r["status"] for r in got] == [201, 200, 409, 400, 201, 200]
    assert got[1]["task"]["task_id"] == got[0]["task"]["task_id"]
    item_error(got[2], 409, "IDEMPOTENCY_CONFLICT", "tasks[2].idempotency_key")
    assert got[5]["task"]["task_id"] == got[4]["task"]["task_id"]
    assert await stored_counts(db) == {"tasks": 2, "idempotency_records": 2, "resource_keys": 0}


async def test_whole_request_refusals(running_node, db, node_config):
    tenant = await make_tenant(db)
    q = tenant.queue_id
    no_scope = await make_token(db, tenant, {"tasks:read": "*"})
    async with running_node.client(tenant.token) as client:
        for body, field in (
            ({}, "tasks"),
            ({"tasks": {"a": 1}}, "tasks"),
            ({"tasks": []}, "tasks"),
            ({"tasks": [task(q, "k")], "atomic": True}, "atomic"),
            ([task(q, "k")], "body"),
        ):
            response = await client.post("/v1/tasks/batch", json=body)
            assert_error(response, 400, "INVALID_ARGUMENT", field)
        response = await client.post(
            "/v1/tasks/batch", content=b'{"tasks": [', headers={"Content-Type": "application/json"}
        )
        assert_error(response, 400, "INVALID_ARGUMENT", "body")
        response = await batch(client, [task(q, "k")], headers={"Idempotency-Key": "k"})
        assert_error(response, 400, "INVALID_ARGUMENT", "Idempotency-Key")
        over = await batch(client, [task(q, f"k{i}") for i in range(1001)])
        error = assert_error(over, 400, "INVALID_ARGUMENT", "tasks")
        assert "1000" in error["message"] and "1001" in error["message"]
        padding = "x" * node_config.max_body_bytes
        assert_error(await batch(client, [task(q, "big", payload=padding)]), 413, "PAYLOAD_TOO_LARGE", "body")
    async with running_node.client(no_scope) as client:
        assert_error(await batch(client, [task(q, "k")]), 403, "PERMISSION_DENIED", "authorization")
    assert await stored_counts(db) == {"tasks": 0, "idempotency_records": 0, "resource_keys": 0}


async def test_a_thousand_tasks_in_one_batch(running_node, db):
    tenant = await make_tenant(db)
    items = [task(tenant.queue_id, f"k{i:04d}", resource_key=f"objects/{i % 7}") for i in range(1000)]
    async with running_node.client(tenant.token) as client:
        got = results(await batch(client, items))
    assert [r["status"] for r in got] == [201] * 1000
    assert len({r["task"]["task_id"] for r in got}) == 1000
    assert await stored_counts(db) == {"tasks": 1000, "idempotency_records": 1000, "resource_keys": 7}


async def test_scopes_and_queues_are_checked_per_item(running_node, db):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    other = await make_tenant(db, "other-app")
    q1, q2 = tenant.queues["q1"], tenant.queues["q2"]
    only_q1 = await make_token(db, tenant, {"tasks:submit": [q1]})
    items = [
        task(q1, "a"),
        task(q2, "b"),  # outside the credential's grant
        task(other.queue_id, "c"),  # outside it too: the grant is checked before the queue, as for one task
        task(q1, "e"),
    ]
    async with running_node.client(only_q1) as client:
        got = results(await batch(client, items))
    assert [r["status"] for r in got] == [201, 403, 403, 201]
    item_error(got[1], 403, "PERMISSION_DENIED", "tasks[1].queue_id")
    item_error(got[2], 403, "PERMISSION_DENIED", "tasks[2].queue_id")
    # The full-scope credential of the namespace may use q2 (the refused key is free), and
    # another tenant's queue is not found, exactly like one that does not exist.
    async with running_node.client(tenant.token) as client:
        got = results(await batch(client, [task(q2, "b"), task(other.queue_id, "c"), task("f" * 32, "d")]))
    assert [r["status"] for r in got] == [201, 404, 404]
    item_error(got[1], 404, "NOT_FOUND", "tasks[1].queue_id")
    item_error(got[2], 404, "NOT_FOUND", "tasks[2].queue_id")
    assert await stored_counts(db) == {"tasks": 3, "idempotency_records": 3, "resource_keys": 0}


FAIL_ON_BOOM = """
CREATE TRIGGER fail_on_boom BEFORE INSERT ON tasks FOR EACH ROW
BEGIN
  IF NEW.handler = 'boom' THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure';
  END IF;
END
"""


async def test_a_batch_is_one_transaction(node_config, db):
    # Payloads of 4 KB make the 1,000 tasks several INSERT statements (the driver splits
    # at 1 MB); the database refuses the last row, after the first statements ran.
    config = attrs.evolve(node_config, max_body_bytes=16 * 1024 * 1024)
    tenant = await make_tenant(db)
    q = tenant.queue_id
    big = "p" * 4096
    async with run_node(config) as node, node.client(tenant.token) as client:
        kept = results(await batch(client, [task(q, "kept-0"), task(q, "kept-1")]))
        assert [r["status"] for r in kept] == [201, 201]
        await db.run(lambda tx: tx.execute_raw(FAIL_ON_BOOM))
        items = [task(q, f"k{i:04d}", payload=big, resource_key=f"r{i}") for i in range(999)]
        items.append(task(q, "k0999", handler="boom"))
        items[0] = task(q, "kept-0")  # a repeat inside the failing batch changes nothing either
        failed = await batch(client, items)
        assert_error(failed, 500, "INTERNAL", None)
        assert await stored_counts(db) == {"tasks": 2, "idempotency_records": 2, "resource_keys": 0}

        await db.run(lambda tx: tx.execute_raw("DROP TRIGGER fail_on_boom"))
        again = results(await batch(client, items))
        assert [r["status"] for r in again] == [200] + [201] * 999
        assert again[0]["task"] == kept[0]["task"]
    assert await stored_counts(db) == {"tasks": 1001, "idempotency_records": 1001, "resource_keys": 998}


async def test_parallel_batches_with_the_same_keys_create_each_task_once(running_node, db):
    tenant = await make_tenant(db)
    items = [task(tenant.queue_id, f"k{i:03d}") for i in range(200)]
    answers: list[list[dict]] = []

    async def one(client):
        answers.append(results(await batch(client, items)))

    async with running_node.client(tenant.token, limits=httpx.Limits(max_connections=4)) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one, client)
    for index in range(200):
        answered = [answer[index] for answer in answers]
        assert sorted(r["status"] for r in answered) == [200, 200, 200, 201]
        assert len({r["task"]["task_id"] for r in answered}) == 1
    assert await stored_counts(db) == {"tasks": 200, "idempotency_records": 200, "resource_keys": 0}


async def test_prefer_return_minimal_answers_ids_and_states_only(running_node, db):
    """RFC 7240: ``Prefer: return=minimal`` gives each accepted item its task id and state
    (``Preference-Applied`` says so); refusals and the counts are the same; anything else
    in the header is ignored."""
    tenant = await make_tenant(db)
    items = [task(tenant.queue_id, "m1"), task(tenant.queue_id, "m2", priority=10), task(tenant.queue_id, "m1")]
    async with running_node.client(tenant.token) as client:
        minimal = await batch(client, items, headers={"Prefer": 'respond-async, return="minimal"; x=1'})
        assert minimal.headers["Preference-Applied"] == "return=minimal"
        first, refused, repeat = results(minimal)
        assert set(first) == {"index", "status", "task_id", "state"}
        assert (first["status"], first["state"]) == (201, "queued")
        item_error(refused, 400, "INVALID_ARGUMENT", "tasks[1].priority")
        assert (repeat["status"], repeat["task_id"]) == (200, first["task_id"])
        # The same keys again with the whole representation: the tasks of the minimal answer.
        full = results(await batch(client, items[:1]))
        assert full[0]["task"]["task_id"] == first["task_id"] and full[0]["status"] == 200
        ignored = await batch(client, items[:1], headers={"Prefer": "return=representation, wait=5"})
        assert "task" in results(ignored)[0] and "Preference-Applied" not in ignored.headers
    assert (await stored_counts(db))["tasks"] == 1
