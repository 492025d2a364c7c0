"""orbit-admin task cancel|retry|list and queue pause|resume, as an operator runs them,
against a real MariaDB: what they change, what they print, and every refusal as one line."""

from __future__ import annotations

import trio

from orbit_node.domain.rules import NewTask
from orbit_node.store.tasks import TaskStore
from orbit_node.store.tenancy import TenancyStore

from ..nodeutil import make_tenant
from .test_admin import TEST_TIMEOUT_S, admin, admin_json, one_line_error
from .test_api_tasks import set_columns


async def submit(db, tenant, key: str, queue: str = "q1", **fields) -> str:
    new = NewTask(
        queue_id=tenant.queues[queue], handler="h", handler_version="v1", payload_version="v1", payload={}, **fields
    )
    return (await TaskStore(db).submit(tenant.namespace_id, key, new)).task.task_id


async def state_of(db, task_id: str) -> tuple[str, bool]:
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT state, cancel_requested FROM tasks WHERE task_id = %s", (task_id,))
    )
    return rows[0]["state"], bool(rows[0]["cancel_requested"])


async def signals(db) -> list[tuple[str, str | None, str | None]]:
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT kind, queue_id, task_id FROM node_signals ORDER BY signal_id")
    )
    return [(r["kind"], r["queue_id"], r["task_id"]) for r in rows]


async def test_cancel_and_retry_a_task_by_id(dsn, db):
    tenant = await make_tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        queued, running, done = [await submit(db, tenant, k) for k in ("a", "b", "c")]
        await set_columns(db, running, "state = 'running', reserved_at = NOW(6), started_at = NOW(6)")
        await set_columns(db, done, "state = 'succeeded', finished_at = NOW(6)")

        text = await admin("task", "cancel", queued, dsn=dsn)
        assert text.returncode == 0 and text.stdout.strip() == f"task {queued} (app/default/q1): cancelled"
        assert await state_of(db, queued) == ("cancelled", True)
        again = await admin_json("task", "cancel", queued, dsn=dsn)
        assert again == {"task_id": queued, "outcome": "unchanged", "state": "cancelled"}
        asked = await admin_json("task", "cancel", running, dsn=dsn)
        assert asked == {"task_id": running, "outcome": "cancel_requested", "state": "running"}
        assert await state_of(db, running) == ("running", True)
        line = one_line_error(await admin("task", "cancel", done, dsn=dsn))
        assert line.startswith(f"error: FAILED_PRECONDITION: task_id: task {done} already finished as succeeded")

        retried = await admin_json("task", "retry", queued, dsn=dsn)
        assert retried["outcome"] == "retried" and retried["state"] == "cancelled"
        text = await admin("task", "retry", queued, dsn=dsn)
        assert text.returncode == 0
        assert text.stdout.strip().endswith(f"retried before as task {retried['retry_task_id']}; nothing changed")
        new = await TaskStore(db).get(tenant.namespace_id, retried["retry_task_id"])
        assert new.retried_from == queued and new.state == "queued"
        line = one_line_error(await admin("task", "retry", done, dsn=dsn))
        assert line.startswith(f"error: FAILED_PRECONDITION: task_id: task {done} cannot be retried: it succeeded")
        line = one_line_error(await admin("task", "retry", "f" * 32, dsn=dsn))
        assert line.startswith("error: NOT_FOUND")
        one_line_error(await admin("task", "cancel", "nope", dsn=dsn), 2)
    # The nodes hear of the running task's cancel and of the new task at once.
    assert await signals(db) == [("cancel", None, running), ("tasks", tenant.queues["q1"], None)]


async def test_task_list_filters_pages_and_says_why_tasks_wait(dsn, db):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    with trio.fail_after(TEST_TIMEOUT_S):
        ids = [await submit(db, tenant, f"k{i}", priority=i % 3) for i in range(5)]
        other = await submit(db, tenant, "other", queue="q2")
        await set_columns(db, ids[0], "state = 'failed', finished_at = NOW(6)")
        base = ["task", "list", "--application", "app"]

        everything = await admin_json(*base, dsn=dsn)
        assert [t["task_id"] for t in everything["tasks"]] == [other, *ids[::-1]] and everything["next_cursor"] is None
        assert (
            everything["tasks"][0]["queue"] == "q2" and everything["tasks"][0]["waiting_reason"] == "NO_CAPABLE_WORKER"
        )
        in_q1 = await admin_json(*base, "--queue", "q1", "--state", "queued,failed", dsn=dsn)
        assert [t["task_id"] for t in in_q1["tasks"]] == ids[::-1]
        failed = await admin_json(*base, "--state", "failed", dsn=dsn)
        assert [(t["task_id"], t["waiting_reason"]) for t in failed["tasks"]] == [(ids[0], None)]
        levels = await admin_json(*base, "--priority", "1", "--priority", "2", "--queue", tenant.queues["q1"], dsn=dsn)
        assert sorted(t["task_id"] for t in levels["tasks"]) == sorted(i for n, i in enumerate(ids) if n % 3)
        named = await admin_json(*base, "--task-id", f"{ids[1]},{other}", dsn=dsn)
        assert [t["task_id"] for t in named["tasks"]] == [other, ids[1]]

        first = await admin_json(*base, "--limit", "4", dsn=dsn)
        rest = await admin_json(*base, "--limit", "4", "--cursor", first["next_cursor"], dsn=dsn)
        assert [t["task_id"] for t in first["tasks"] + rest["tasks"]] == [other, *ids[::-1]]
        assert rest["next_cursor"] is None
        text = await admin(*base, "--limit", "4", dsn=dsn)
        assert text.returncode == 0 and other in text.stdout and "NO_CAPABLE_WORKER" in text.stdout
        assert text.stdout.strip().splitlines()[-1] == f"more: --cursor {first['next_cursor']}"

        for extra, message in (
            (["--state", "done"], "INVALID_ARGUMENT: --state: must be one of"),
            (["--priority-min", "5", "--priority-max", "4"], "INVALID_ARGUMENT: --priority-max: must not be less"),
            (["--created-after", "yesterday"], "INVALID_ARGUMENT: --created-after: must be an RFC 3339 timestamp"),
            (["--cursor", "x"], "INVALID_ARGUMENT: --cursor: not a cursor"),
            (["--limit", "0"], "--limit: must be from 1 to 500"),
        ):
            line = one_line_error(await admin(*base, *extra, dsn=dsn), 2)
            assert line.startswith(f"error: {message}"), line
        line = one_line_error(await admin(*base, "--queue", "nosuch", dsn=dsn))
        assert line.startswith("error: NOT_FOUND: --queue: no queue named 'nosuch'")
        line = one_line_error(await admin("task", "list", "--application", "app", "--namespace", "x", dsn=dsn))
        assert line.startswith("error: NOT_FOUND: namespace: 'x' not found")


async def test_pause_and_resume_a_queue_by_name_or_id(dsn, db):
    tenant = await make_tenant(db)
    queue_id = tenant.queues["q1"]
    tenancy = TenancyStore(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        text = await admin("queue", "pause", "q1", "--application", "app", dsn=dsn)
        assert text.returncode == 0 and text.stdout.strip() == f"queue q1 ({queue_id}) paused"
        assert (await tenancy.get_queue(tenant.namespace_id, queue_id)).paused
        again = await admin_json("queue", "pause", queue_id, dsn=dsn)
        assert again == {"queue_id": queue_id, "name": "q1", "paused": True}
        resumed = await admin_json("queue", "resume", queue_id, dsn=dsn)
        assert resumed["paused"] is False and not (await tenancy.get_queue(tenant.namespace_id, queue_id)).paused
        line = one_line_error(await admin("queue", "pause", "q1", dsn=dsn), 2)
        assert "is not a queue id; give a queue name with --application" in line
        line = one_line_error(await admin("queue", "pause", "f" * 32, dsn=dsn))
        assert line.startswith(f"error: NOT_FOUND: queue {'f' * 32} not found")
        line = one_line_error(await admin("queue", "resume", "nosuch", "--application", "app", dsn=dsn))
        assert line.startswith("error: NOT_FOUND: QUEUE: no queue named 'nosuch'")
    # Waiting claims of the resumed queue are woken on every node.
    assert await signals(db) == [("tasks", queue_id, None)]


async def test_task_list_of_failed_tasks_says_what_broke_when_and_what_retried_it(dsn, db):
    tenant = await make_tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        broken, retried = [await submit(db, tenant, f"f{i}") for i in range(2)]
        error = '{"code":"IMAGE_BAD","message":"RuntimeError: cannot decode image img-7.png","traceback":"..."}'
        for task_id in (broken, retried):
            await set_columns(db, task_id, f"state = 'failed', finished_at = NOW(6), attempts = 3, error = '{error}'")
        retry = await admin_json("task", "retry", retried, dsn=dsn)
        retry_id = retry["outcome"]["task"]["task_id"] if "task" in retry["outcome"] else None
        # No --application: the database holds one.
        listed = await admin_json("task", "list", "--state", "failed", dsn=dsn)
        rows = {t["task_id"]: t for t in listed["tasks"]}
        assert set(rows) == {broken, retried}
        assert rows[broken]["error"] == "IMAGE_BAD: RuntimeError: cannot decode image img-7.png"
        assert rows[broken]["finished_at"] is not None and rows[broken]["retried_by"] is None
        assert rows[retried]["retried_by"] is not None and rows[retried]["retried_by"] != retried
        if retry_id is not None:
            assert rows[retried]["retried_by"] == retry_id
        text = await admin("task", "list", "--state", "failed", dsn=dsn)
        assert text.returncode == 0, text.stderr
        assert "IMAGE_BAD: RuntimeError: cannot decode" in text.stdout
        assert f"retried as {rows[retried]['retried_by']}" in text.stdout
        again = await admin_json("task", "list", "--task-id", rows[retried]["retried_by"], dsn=dsn)
        assert again["tasks"][0]["retried_from"] == retried
        # Two applications: --application is needed, and the error names them.
        await make_tenant(db, "second")
        ambiguous = await admin("task", "list", dsn=dsn)
        assert ambiguous.returncode == 2
        assert one_line_error(ambiguous, 2) == (
            "error: --application: required, the database holds 2 applications (app, second)"
        )
