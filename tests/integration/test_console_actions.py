"""The console's writes over HTTP, on a real node: form tokens (CSRF), scopes, the answers
and the audit record; then what the console reads for them: large values shown by their
beginning, attempts' errors, queues whose due tasks no connected Worker can run, task
search by id prefix and paging.

The browser tests (tests/system/test_console_browser.py) click the same buttons in Chromium.
"""

from __future__ import annotations

import json
import re
import time
from html import unescape

import httpx
import pytest

from orbit_node.api.console.session import SessionSigner
from orbit_node.api.console.values import layout
from orbit_node.store.audit import AuditStore
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..nodeutil import Tenant, make_tenant, make_token
from .test_admin import admin, admin_json, one_line_error
from .test_console import console, form_token, main_of, sign_in, submit

FORM = "csrf_token"


async def token_of(client: httpx.AsyncClient, path: str = "/console") -> str:
    return form_token((await client.get(path)).text)


async def new_task(api: httpx.AsyncClient, queue_id: str, key: str, **more: object) -> str:
    created = await api.post("/v1/tasks", json=submit(queue_id, **more), headers={"Idempotency-Key": key})
    assert created.status_code == 201, created.text
    return created.json()["data"]["task_id"]


async def state_of(db, task_id: str) -> str:
    return (await seed.task_row(db, task_id))["state"]


async def audit_rows(db) -> list[dict]:
    return await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM audit_records ORDER BY audit_id"))


def seed_tenant(tenant: Tenant, queue: str | None = None) -> seed.Tenant:
    return seed.Tenant(tenant.application_id, tenant.namespace_id, tenant.queues[queue] if queue else tenant.queue_id)


# -- form tokens ---------------------------------------------------------------------------


def test_a_form_token_belongs_to_one_session_and_one_key():
    signer = SessionSigner(b"k" * 32, 3600)
    one, two = signer.issue("a" * 32), signer.issue("b" * 32)
    token = signer.form_token(one)
    assert re.fullmatch(r"[0-9a-f]{64}", token) and signer.form_token_valid(one, token)
    assert not signer.form_token_valid(two, token)
    assert not SessionSigner(b"j" * 32, 3600).form_token_valid(one, token)
    for wrong in (None, "", token[:-1], token.upper(), "é" * 64):
        assert not signer.form_token_valid(one, wrong)


async def test_a_write_without_this_sessions_form_token_is_refused_and_changes_nothing(running_node, db):
    tenant = await make_tenant(db)
    other_credential = await make_token(db, tenant, {"tasks:read": "*", "tasks:cancel": "*"})
    async with running_node.client(tenant.token) as api:
        task_id = await new_task(api, tenant.queue_id, "a")
    cancel = f"/console/tasks/{task_id}/cancel"
    async with console(running_node) as client, console(running_node) as elsewhere:
        await sign_in(client, tenant.token)
        await sign_in(elsewhere, other_credential)
        mine = await token_of(client, f"/console/tasks/{task_id}")
        theirs = await token_of(elsewhere)
        assert mine != theirs
        for data, headers in (
            ({}, {}),  # no token: what a form on another site posts
            ({FORM: ""}, {}),
            ({FORM: theirs}, {}),  # the token of another session
            ({FORM: mine}, {"Origin": "https://evil.example"}),
        ):
            refused = await client.post(cancel, data=data, headers=headers)
            assert refused.status_code == 403, (data, headers, refused.text)
            assert 'data-code="PERMISSION_DENIED"' in refused.text
            field = "origin" if headers else FORM
            assert f"{field}: " in refused.text
        # Without a session a post is sent to sign in, whatever it carries.
        async with console(running_node) as stranger:
            anonymous = await stranger.post(cancel, data={FORM: mine})
        assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/console/sign-in")
        assert await state_of(db, task_id) == "queued" and await audit_rows(db) == []

        done = await client.post(cancel, data={FORM: mine})
        assert (done.status_code, done.headers["location"]) == (303, f"/console/tasks/{task_id}?done=cancelled")
        assert await state_of(db, task_id) == "cancelled"
        shown = await client.get(done.headers["location"])
        assert 'id="action-message"' in shown.text and "Task cancelled" in shown.text
        # The live panel's url keeps no message (the page says it once).
        assert f'data-live="/console/tasks/{task_id}?fragment=live"' in shown.text


async def test_buttons_follow_the_scopes_and_the_node_refuses_what_they_do_not_allow(running_node, db):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    q1, q2 = tenant.queues["q1"], tenant.queues["q2"]
    reader = await make_token(db, tenant, {"tasks:read": "*"})
    limited = await make_token(db, tenant, {"tasks:read": "*", "tasks:cancel": [q1], "queues:manage": [q1]})
    async with running_node.client(tenant.token) as api:
        one = await new_task(api, q1, "1")
        two = await new_task(api, q2, "2")
    async with console(running_node) as client:
        await sign_in(client, reader)
        overview = await client.get("/console")
        page = await client.get(f"/console/tasks/{one}")
        assert 'class="action"' not in main_of(overview.text) and 'class="action"' not in main_of(page.text)
        token = form_token(page.text)
        for path, scope in (
            (f"/console/tasks/{one}/cancel", "tasks:cancel"),
            (f"/console/queues/{q1}/pause", "queues:manage"),
            (f"/console/queues/{q1}/resume", "queues:manage"),
        ):
            refused = await client.post(path, data={FORM: token})
            assert refused.status_code == 403 and f"credential lacks scope {scope} for queue" in refused.text, path

        await sign_in(client, limited)
        overview = (await client.get("/console")).text
        rows = {q: overview[overview.index(f'<tr data-queue-id="{q}"') :].split("</tr>")[0] for q in (q1, q2)}
        assert 'data-action="pause"' in rows[q1] and 'class="action"' not in rows[q2]
        assert 'data-action="cancel"' in (await client.get(f"/console/tasks/{one}")).text
        assert 'data-action="cancel"' not in (await client.get(f"/console/tasks/{two}")).text
        token = await token_of(client)
        assert (await client.post(f"/console/tasks/{two}/cancel", data={FORM: token})).status_code == 403
        assert (await client.post(f"/console/queues/{q2}/pause", data={FORM: token})).status_code == 403
        # Bad input: a field the form does not have, a page to return to outside the console.
        odd = await client.post(f"/console/queues/{q1}/pause", data={FORM: token, "paused": "1"})
        assert odd.status_code == 400 and "paused: not a field of this form" in odd.text
        away = await client.post(f"/console/queues/{q1}/pause", data={FORM: token, "back": "https://evil.example/"})
        assert away.headers["location"] == f"/console/queues/{q1}?done=paused"
    assert [await state_of(db, t) for t in (one, two)] == ["queued", "queued"]
    assert [(r["action"], r["queue_id"]) for r in await audit_rows(db)] == [("queue.pause", q1)]


async def test_cancel_pause_and_resume_answer_what_they_did_and_are_audited(running_node, db, dsn):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    q1 = tenant.queue_id
    other = await make_tenant(db, "other")
    only_q2 = await make_token(db, tenant, {"tasks:read": [tenant.queues["q2"]]})
    # One task is reserved and started by a Worker (through the store, as the node would).
    async with running_node.client(tenant.token) as api:
        running = await new_task(api, q1, "r")
        store = seed.lease_store(db)
        (attempt,) = await store.claim(seed.claim_request(seed_tenant(tenant), limit=1))
        await store.start(running, attempt.fencing_token)
        queued = await new_task(api, q1, "q")

    answers = []
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        token = await token_of(client)
        for path, back in (
            (f"/console/tasks/{queued}/cancel", None),
            (f"/console/tasks/{queued}/cancel", None),
            (f"/console/tasks/{running}/cancel", None),
            (f"/console/tasks/{running}/cancel", None),
            (f"/console/queues/{q1}/pause", "/console"),
            (f"/console/queues/{q1}/pause", None),
            (f"/console/queues/{q1}/resume", None),
            (f"/console/queues/{q1}/resume", None),
        ):
            data = {FORM: token} if back is None else {FORM: token, "back": back}
            response = await client.post(path, data=data)
            assert response.status_code == 303, response.text
            answers.append(response.headers["location"])
        # A task that finished otherwise cannot be cancelled: said, not recorded.
        await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id = %s", (running,)))
        finished = await client.post(f"/console/tasks/{running}/cancel", data={FORM: token})
        assert finished.status_code == 409 and "Not done" in finished.text and "already finished" in finished.text
        assert f'href="/console/tasks/{running}"' in finished.text  # back to where it came from
        audit_page = await client.get("/console/audit")

    assert answers == [
        f"/console/tasks/{queued}?done=cancelled",
        f"/console/tasks/{queued}?done=already-cancelled",
        f"/console/tasks/{running}?done=cancel-requested",
        f"/console/tasks/{running}?done=already-cancel-requested",
        "/console?done=paused",
        f"/console/queues/{q1}?done=already-paused",
        f"/console/queues/{q1}?done=resumed",
        f"/console/queues/{q1}?done=already-open",
    ]
    credential_id = tenant.token[4:36]
    rows = await audit_rows(db)
    assert [(r["action"], r["task_id"], r["queue_id"], r["changed"], r["outcome"]) for r in rows] == [
        ("task.cancel", queued, q1, 1, "cancelled"),
        ("task.cancel", queued, q1, 0, "already cancelled"),
        ("task.cancel", running, q1, 1, "cancel requested"),
        ("task.cancel", running, q1, 0, "already cancel requested"),
        ("queue.pause", None, q1, 1, "paused"),
        ("queue.pause", None, q1, 0, "already paused"),
        ("queue.resume", None, q1, 1, "resumed"),
        ("queue.resume", None, q1, 0, "already open"),
    ]
    assert {(r["credential_id"], r["namespace_id"], r["via"]) for r in rows} == {
        (credential_id, tenant.namespace_id, "console")
    }

    # The audit page: newest first, who, what, how many.
    listed = re.findall(r'<tr data-audit-id="(\d+)" data-action="([\w.]+)" data-changed="(\d)">', audit_page.text)
    assert [(a, n) for _, a, n in listed] == [(r["action"], str(r["changed"])) for r in reversed(rows)]
    assert credential_id in audit_page.text and "(you)" in audit_page.text
    # Another namespace sees none of it; a credential that reads only q2 none of q1's.
    for token in (other.token, only_q2):
        async with console(running_node) as client:
            await sign_in(client, token)
            assert "data-audit-id" not in (await client.get("/console/audit")).text
    page = await AuditStore(db).list(namespace_id=tenant.namespace_id, limit=3)
    assert [r.audit_id for r in page.records] == [r["audit_id"] for r in rows[-1:-4:-1]]
    assert page.last == rows[-3]["audit_id"]

    # orbit-admin audit list: the same records, paged.
    listing = await admin_json("audit", "list", "--application", "app", "--limit", "5", dsn=dsn)
    assert [r["action"] for r in listing["records"]] == [r["action"] for r in rows[::-1][:5]]
    assert listing["next_before"] == rows[-5]["audit_id"]
    first = listing["records"][0]
    assert (first["credential_id"], first["queue_id"], first["changed"], first["application"]) == (
        credential_id,
        q1,
        0,
        "app",
    )
    rest = await admin_json("audit", "list", "--before", str(listing["next_before"]), dsn=dsn)
    assert [r["audit_id"] for r in rest["records"]] == [r["audit_id"] for r in rows[2::-1]]
    assert rest["next_before"] is None
    assert (await admin_json("audit", "list", "--application", "other", dsn=dsn))["records"] == []
    text = await admin("audit", "list", "--application", "app", "--credential", credential_id, dsn=dsn)
    assert text.returncode == 0 and "queue.resume" in text.stdout and "older records" not in text.stdout
    for args, message in (
        (("--namespace", "default"), "--namespace needs --application"),
        (("--credential", "nope"), "--credential: 'nope' is not a credential id"),
        (("--limit", "0"), "--limit: expected 1 to 500"),
    ):
        assert message in one_line_error(await admin("audit", "list", *args, dsn=dsn), 2)
    assert "application: 'ghost' not found" in one_line_error(
        await admin("audit", "list", "--application", "ghost", dsn=dsn)
    )


# -- values, attempts ------------------------------------------------------------------------


def test_the_layout_of_a_value_is_json_dumps_indent_2_of_any_beginning():
    value = {"z": [1, {"a": "x, y: {z}", "e": []}, {}], "s": 'q"uo\\te', "n": None, "big": 10**40, "é": True}
    for separators in ((", ", ": "), (",", ":")):
        stored = json.dumps(value, ensure_ascii=False, separators=separators)
        expected = json.dumps(value, ensure_ascii=False, indent=2)
        assert layout(stored, 10_000) == (expected, False)
        for limit in range(1, len(expected) + 1, 7):
            assert layout(stored, limit) == (expected[:limit], limit < len(expected))
        # The beginning of a longer value lays out like the value's own beginning.
        assert layout(stored[:20], 10_000)[0] == expected[: len(layout(stored[:20], 10_000)[0])]
    assert layout("plain text, [not json]", 5) == ("plain", True)


async def test_large_values_are_shown_by_their_beginning_and_whole_on_their_own_route(running_node, db):
    tenant = await make_tenant(db)
    owner = seed_tenant(tenant)
    payload = {"rows": [{"n": n, "text": "<b>row</b>" * 10} for n in range(10_000)]}
    stored = json.dumps(payload, ensure_ascii=False)
    assert len(stored) > 1_000_000
    task_id = await seed.insert_task(db, owner, payload=stored)
    result = json.dumps({"total": 10**30, "lines": ["line"] * 200_000})
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = 'succeeded', finished_at = NOW(6), result = %s WHERE task_id = %s",
            (result, task_id),
        )
    )
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        page = await client.get(f"/console/tasks/{task_id}")
        assert page.status_code == 200 and len(page.content) < 40_000
        shown = re.search(
            r'<pre id="payload" class="value" data-size="(\d+)" data-truncated="yes">(.*?)</pre>', page.text, re.S
        )
        assert shown and int(shown.group(1)) == len(stored.encode())
        # The beginning, laid out, escaped.
        assert shown.group(2).startswith("{\n  &#34;rows&#34;: [\n    {\n      &#34;n&#34;: 0,")
        assert "&lt;b&gt;row&lt;/b&gt;" in shown.group(2) and "<b>row" not in page.text
        assert f'href="/console/tasks/{task_id}/payload"' in page.text
        assert f'href="/console/tasks/{task_id}/result"' in page.text and 'id="result-cut"' in page.text

        # The live refresh sends neither the payload nor the whole result.
        panel = await client.get(f"/console/tasks/{task_id}?fragment=live")
        assert panel.status_code == 200 and len(panel.content) < 20_000 and 'id="payload"' not in panel.text

        # Each value whole, byte for byte, for this namespace only.
        whole = await client.get(f"/console/tasks/{task_id}/payload")
        assert whole.status_code == 200 and whole.headers["content-type"] == "application/json; charset=utf-8"
        assert whole.text == stored
        assert (await client.get(f"/console/tasks/{task_id}/result")).text == result
        missing = await client.get(f"/console/tasks/{task_id}/error")
        assert missing.status_code == 404 and "no such value" in missing.text
    other = await make_tenant(db, "other")
    async with console(running_node) as client:
        await sign_in(client, other.token)
        theirs = await client.get(f"/console/tasks/{task_id}/payload")
        assert theirs.status_code == 404 and stored[:50] not in theirs.text


async def test_attempts_errors_have_a_row_of_their_own_and_a_link_to_the_whole(running_node, db):
    tenant = await make_tenant(db)
    owner = seed_tenant(tenant)
    task_id = await seed.insert_task(db, owner, max_attempts=5)
    store = seed.lease_store(db)
    errors = [
        {"code": "BOOM", "message": "short"},
        {"code": "TRACE", "message": "Traceback (most recent call last):\n" + "  frame <x>\n" * 500},
    ]
    for error in errors:
        (attempt,) = await store.claim(seed.claim_request(owner))
        await store.start(task_id, attempt.fencing_token)
        await store.finish(task_id, attempt.fencing_token, error=error, retryable=True)
        await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET available_at = NOW(6) WHERE task_id = %s", (task_id,)))
    attempts = await seed.attempt_rows(db, task_id)
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        page = (await client.get(f"/console/tasks/{task_id}")).text
        rows = re.findall(
            r'<tr class="attempt-error" data-attempt-id="(\d+)"><td></td><td colspan="6">(.*?)</td></tr>', page, re.S
        )
        assert [int(a) for a, _ in rows] == [a["attempt_id"] for a in attempts]
        short, long = rows[0][1], rows[1][1]
        # As people read an error: its code, then its message with its line breaks.
        assert "BOOM: short</pre>" in short and 'data-truncated="no"' in short
        assert "TRACE: Traceback (most recent call last):\n  frame &lt;x&gt;\n  frame" in long
        assert 'data-truncated="yes"' in long and "frame &lt;x&gt;" in long
        link = f"/console/tasks/{task_id}/attempts/{attempts[1]['attempt_id']}/error"
        assert f'href="{link}"' in long
        assert json.loads((await client.get(link)).text) == errors[1]
        assert (
            await client.get(f"/console/tasks/{'0' * 32}/attempts/{attempts[1]['attempt_id']}/error")
        ).status_code == 404


# -- queues whose due tasks no connected Worker can run ----------------------------------------


async def register_worker(db, node_id: str, connection_id: str, namespace_id: str, queues, capabilities, **more):
    """A registry row as a node writes it for a connected Worker (``heartbeat_ago_s``: its age)."""
    age = more.get("heartbeat_ago_s", 0)
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT IGNORE INTO nodes (node_id, hostname, http_addr, version) VALUES (%s, 'h', 'a', 'v')", (node_id,)
        )
    )
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO worker_connections (connection_id, node_id, namespace_id, queues, capabilities,"
            " resource_key_support, heartbeat_at) VALUES (%s, %s, %s, %s, %s, %s, NOW(6) - INTERVAL %s SECOND)",
            (
                connection_id,
                node_id,
                namespace_id,
                json.dumps(queues),
                json.dumps(capabilities),
                int(more.get("resource_keys", False)),
                age,
            ),
        )
    )


@pytest.mark.parametrize("page", ["overview", "queue"])
async def test_queues_holding_due_tasks_no_connected_worker_can_run_are_marked(running_node, db, page):
    tenant = await make_tenant(db, queues=("served", "orphan", "later"))
    served, orphan, later = (seed_tenant(tenant, q) for q in ("served", "orphan", "later"))
    await seed.insert_tasks(
        db,
        served,
        [
            seed.TaskSpec(available_in_s=-5),
            seed.TaskSpec(available_in_s=-5, resource_key="k"),  # the Worker has no key support
            seed.TaskSpec(available_in_s=10, priority=9),  # inside its priority window, not due
        ],
    )
    await seed.insert_tasks(db, orphan, [seed.TaskSpec(available_in_s=-1, handler="report")] * 3)
    await seed.insert_tasks(db, later, [seed.TaskSpec(available_in_s=3600, handler="report")])
    cap = ["h", "v1", "v1"]
    await register_worker(db, "1" * 32, "c1", tenant.namespace_id, [served.queue_id], [cap])
    # A connection whose node stopped refreshing it serves nothing.
    await register_worker(
        db, "1" * 32, "c2", tenant.namespace_id, [orphan.queue_id], [["report", "v1", "v1"]], heartbeat_ago_s=120
    )
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        if page == "overview":
            html = (await client.get("/console")).text
            rows = {
                name: html[html.index(f'<tr data-queue-id="{q.queue_id}"') :].split("</tr>")[0]
                for name, q in (("served", served), ("orphan", orphan), ("later", later))
            }
            assert "no Worker for 1 due" in rows["served"] and "keyed" in rows["served"]
            assert "no Worker for 3 due" in rows["orphan"] and "report v1" in rows["orphan"]
            assert "NO_CAPABLE_WORKER" not in rows["later"] and 'id="stranded-notice"' in html
        else:
            html = (await client.get(f"/console/queues/{served.queue_id}")).text
            listed = re.findall(r'<li data-handler="(\w+)" data-due="(\d+)">(.*?)</li>', html)
            assert [(h, n) for h, n, _ in listed] == [("h", "1")] and "naming a resource key" in listed[0][2]
            html = (await client.get(f"/console/queues/{orphan.queue_id}")).text
            assert re.findall(r'<li data-handler="(\w+)" data-due="(\d+)">', html) == [("report", "3")]
            assert 'id="stranded"' not in (await client.get(f"/console/queues/{later.queue_id}")).text
    # Once a Worker serving them connects, the marks go.
    await register_worker(
        db,
        "2" * 32,
        "c3",
        tenant.namespace_id,
        [served.queue_id, orphan.queue_id],
        [cap, ["report", "v1", "v1"]],
        resource_keys=True,
    )
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        assert "NO_CAPABLE_WORKER" not in (await client.get("/console")).text
        assert 'id="stranded"' not in (await client.get(f"/console/queues/{orphan.queue_id}")).text


# -- task search and paging ---------------------------------------------------------------------


async def test_tasks_are_found_by_the_beginning_of_their_id_filtered_and_paged_past_the_newest(running_node, db):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    owner = seed_tenant(tenant)
    # Ids begin with their acceptance time in milliseconds (ids.time_ordered_id): these
    # begin with this minute's, the one after and the one before.
    minute = int(time.time() * 1000) >> 16
    now, later, earlier = (f"{minute + n:08x}" for n in (0, 1, -1))
    await seed.bulk_insert_tasks(db, owner, 30, id_prefix=now)
    await seed.bulk_insert_tasks(db, owner, 3, id_prefix=later, handler="report")
    await seed.bulk_insert_tasks(db, seed_tenant(tenant, "q2"), 2, id_prefix=earlier, priority=7)
    failed = await seed.insert_task(db, owner, task_id=now + "f" * 24)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'failed' WHERE task_id = %s", (failed,)))

    def ids(html: str) -> list[str]:
        return re.findall(r'<tr data-task-id="(\w+)"', html)

    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        first = await client.get("/console/tasks", params={"task_id": now.upper() + " "})
        assert first.status_code == 200
        # Newest first (created_at, then id): the failed task was written last.
        expected = [failed] + [f"{now}{n:024x}" for n in range(29, -1, -1)]
        assert ids(first.text) == expected[:25]
        # The refresh asks for the same search; a queued task says why it waits.
        assert f'data-live="/console/tasks?task_id={now}&amp;fragment=live"' in first.text
        assert 'data-code="NO_CAPABLE_WORKER">NO_CAPABLE_WORKER</span>' in first.text
        older = re.search(r'<a id="older-tasks" href="([^"]+)">', first.text)
        assert older and 'id="newest-tasks"' not in first.text
        second = await client.get(older.group(1).replace("&amp;", "&"))
        assert ids(second.text) == expected[25:] and 'id="older-tasks"' not in second.text
        assert 'id="newest-tasks"' in second.text

        async def found(**params) -> list[str]:
            page = await client.get("/console/tasks", params=params)
            assert page.status_code == 200, (params, page.text)
            return ids(page.text)

        shorter = await found(task_id=now[:6])
        assert len(shorter) == 25 and shorter[0] == failed and all(t.startswith(now[:6]) for t in shorter)
        assert await found(task_id=now, state="failed") == [failed]
        assert await found(handler="report") == [f"{later}{n:024x}" for n in (2, 1, 0)]
        assert await found(queue_id=tenant.queues["q2"]) == [f"{earlier}{n:024x}" for n in (1, 0)]
        assert await found(priority_min="7") == [f"{earlier}{n:024x}" for n in (1, 0)]
        assert await found(state=["failed", "queued"], handler="report", priority_max="0") == [
            f"{later}{n:024x}" for n in (2, 1, 0)
        ]
        assert await found(created_before="2000-01-01T00:00") == []
        assert len(await found(created_after="2000-01-01T00:00")) == 25
        failed_view = await client.get("/console/failed")
        assert ids(failed_view.text) == [failed] and 'aria-current="page">Failed</a>' in failed_view.text

        whole = await client.get(f"/console/tasks?task_id={failed}")
        assert (whole.status_code, whole.headers["location"]) == (303, f"/console/tasks/{failed}")
        for query, field in (
            ("task_id=xyz", "task_id"),
            ("task_id=" + "a" * 33, "task_id"),
            ("cursor=abc", "cursor"),
            ("state=done", "state"),
            ("priority_min=5&priority_max=3", "priority_max"),
            ("created_after=yesterday", "created_after"),
            ("queue_id=" + "0" * 32, "queue_id"),
        ):
            bad = await client.get("/console/tasks?" + query)
            assert bad.status_code == 400 and f'id="search-error">{field}: ' in bad.text, (query, bad.text[-600:])


# -- retry, and the actions on every task a filter matches ---------------------------------------


FAILED_ERROR = '{"code":"IMAGE_BAD","message":"RuntimeError: cannot decode image img-7.png"}'


async def finished(db, task_id: str, state: str = "failed") -> None:
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = %s, finished_at = NOW(6), error = IF(%s = 'failed', %s, NULL) WHERE task_id = %s",
            (state, state, FAILED_ERROR, task_id),
        )
    )


async def test_a_task_is_retried_from_its_page_once_and_audited(running_node, db):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    reader = await make_token(db, tenant, {"tasks:read": "*"})
    old = await seed.insert_task(db, seed_tenant(tenant))
    other = await seed.insert_task(db, seed_tenant(tenant, "q2"))
    queued = await seed.insert_task(db, seed_tenant(tenant))
    for task_id in (old, other):
        await finished(db, task_id)
    submit_q1 = await make_token(db, tenant, {"tasks:read": "*", "tasks:submit": [tenant.queues["q1"]]})
    async with console(running_node) as client:
        await sign_in(client, reader)
        page = await client.get(f"/console/tasks/{old}")
        assert 'data-action="retry"' not in page.text
        refused = await client.post(f"/console/tasks/{old}/retry", data={FORM: form_token(page.text)})
        assert refused.status_code == 403 and "credential lacks scope tasks:submit for queue" in refused.text

        await sign_in(client, submit_q1)
        assert 'data-action="retry"' not in (await client.get(f"/console/tasks/{other}")).text
        page = await client.get(f"/console/tasks/{old}")
        assert 'data-action="retry"' in page.text
        token = form_token(page.text)
        first = await client.post(f"/console/tasks/{old}/retry", data={FORM: token})
        new = re.fullmatch(r"/console/tasks/(\w{32})\?done=retried", first.headers["location"])
        assert first.status_code == 303 and new, first.headers.get("location")
        retry = new.group(1)
        shown = (await client.get(first.headers["location"])).text
        assert "Retried: this is the new task" in shown and f'id="retried-from" href="/console/tasks/{old}"' in shown
        old_page = (await client.get(f"/console/tasks/{old}")).text
        assert f'id="retried-by" href="/console/tasks/{retry}"' in old_page and 'data-action="retry"' not in old_page
        again = await client.post(f"/console/tasks/{old}/retry", data={FORM: token})
        assert again.headers["location"] == f"/console/tasks/{retry}?done=already-retried"
        live = await client.post(f"/console/tasks/{queued}/retry", data={FORM: token})
        assert live.status_code == 409 and "cannot be retried" in live.text
    row = await seed.task_row(db, retry)
    assert (row["state"], row["retried_from"]) == ("queued", old)
    assert [(r["action"], r["task_id"], r["changed"], r["outcome"]) for r in await audit_rows(db)] == [
        ("task.retry", old, 1, f"retried as {retry}"),
        ("task.retry", old, 0, f"already retried as {retry}"),
    ]


def hidden_fields(html: str) -> list[tuple[str, str]]:
    start = html.index('<form method="post" action="/console/tasks/bulk/')
    form = html[start : html.index("</form>", start)]
    return [(n, unescape(v)) for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)]


def as_form(fields: list[tuple[str, str]]) -> dict[str, list[str]]:
    form: dict[str, list[str]] = {}
    for name, value in fields:
        form.setdefault(name, []).append(value)
    return form


def bulk_count(html: str) -> int:
    return int(re.search(r'id="bulk-confirm" data-action="\w+" data-count="(\d+)"', html).group(1))


async def test_every_task_a_filter_matches_is_cancelled_or_retried_after_a_confirmation_that_counts_them(
    running_node, db, monkeypatch
):
    tenant = await make_tenant(db, queues=("q1", "q2"))
    q1, q2 = tenant.queues["q1"], tenant.queues["q2"]
    reader = await make_token(db, tenant, {"tasks:read": "*"})
    q1_only = await make_token(db, tenant, {"tasks:read": "*", "tasks:submit": [q1], "tasks:cancel": [q1]})
    in_q1, in_q2 = seed_tenant(tenant, "q1"), seed_tenant(tenant, "q2")
    doomed = await seed.insert_tasks(db, in_q1, [seed.TaskSpec()] * 5)
    spared = await seed.insert_tasks(db, in_q1, [seed.TaskSpec(handler="other")] * 2)
    failed = await seed.insert_tasks(db, in_q1, [seed.TaskSpec()] * 3) + await seed.insert_tasks(
        db, in_q2, [seed.TaskSpec()] * 2
    )
    for task_id in failed:
        await finished(db, task_id)

    async with console(running_node) as client:
        await sign_in(client, reader)
        listing = (await client.get("/console/tasks?handler=h")).text
        assert 'id="bulk-actions"' not in listing
        assert (await client.get("/console/tasks/bulk/cancel?handler=h")).status_code == 403

        await sign_in(client, tenant.token)
        listing = (await client.get("/console/tasks?handler=h")).text
        assert 'id="bulk-cancel" href="/console/tasks/bulk/cancel?handler=h"' in listing
        assert 'id="bulk-actions"' not in (await client.get("/console/tasks")).text  # no filter: no bulk
        # Only the actions that could change a task in the filter's states.
        succeeded = (await client.get("/console/tasks?state=succeeded&handler=h")).text
        assert 'id="bulk-actions"' not in succeeded
        failed_list = (await client.get("/console/tasks?state=failed")).text
        assert 'id="bulk-retry"' in failed_list and 'id="bulk-cancel"' not in failed_list
        confirm = await client.get("/console/tasks/bulk/cancel?handler=h")
        assert confirm.status_code == 200 and bulk_count(confirm.text) == 5 and "data-live" not in confirm.text
        fields = hidden_fields(confirm.text)
        assert ("limit", "5") in fields and ("handler", "h") in fields and ("state", "queued") in fields
        # A task accepted after the count is not taken.
        late = await seed.insert_task(db, in_q1)
        without_token = [(n, v) for n, v in fields if n != FORM]
        assert (await client.post("/console/tasks/bulk/cancel", data=as_form(without_token))).status_code == 403
        done = await client.post("/console/tasks/bulk/cancel", data=as_form(fields))
        assert done.status_code == 303
        assert done.headers["location"] == "/console/tasks?handler=h&done=bulk-cancel&changed=5&unchanged=0&refused=0"
        shown = (await client.get(done.headers["location"])).text
        assert "5 tasks cancelled (or, running, asked to stop); 0 had been already" in shown
        assert [await state_of(db, t) for t in (*doomed, *spared, late)] == ["cancelled"] * 5 + ["queued"] * 3

        confirm = await client.get("/console/tasks/bulk/retry?state=failed")
        assert bulk_count(confirm.text) == 5
        done = await client.post("/console/tasks/bulk/retry", data=as_form(hidden_fields(confirm.text)))
        assert done.headers["location"].endswith("done=bulk-retry&changed=5&unchanged=0&refused=0")
        # The failed list says what broke and what retried each task.
        failed_page = (await client.get("/console/tasks?state=failed")).text
        assert failed_page.count("IMAGE_BAD: RuntimeError: cannot decode image img-7.png") == 5
        assert failed_page.count('class="hint retried-as">retried as') == 5
        # Retried tasks stay failed: asked again, the confirmation says they were retried
        # and offers nothing; forced, each answers its retry, nothing is created.
        again = await client.get("/console/tasks/bulk/retry?state=failed")
        assert 'id="bulk-will">0<' in again.text and 'id="bulk-already">5<' in again.text
        assert "Retry 0 tasks" in again.text and " disabled>" in again.text
        done = await client.post("/console/tasks/bulk/retry", data=as_form(hidden_fields(again.text)))
        assert done.headers["location"].endswith("done=bulk-retry&changed=0&unchanged=5&refused=0")
        for query, field in (("", "filter"), (f"task_id={failed[0][:6]}", "task_id"), ("state=done", "state")):
            bad = await client.get("/console/tasks/bulk/cancel?" + query)
            assert bad.status_code == 400 and f"{field}: " in bad.text, query

        # A grant limited to a queue: the count and the action stay within it.
        await sign_in(client, q1_only)
        assert bulk_count((await client.get("/console/tasks/bulk/retry?state=cancelled")).text) == 5
        assert (await client.get(f"/console/tasks/bulk/retry?state=failed&queue_id={q2}")).status_code == 403

        # More than one action takes: it acts on the newest, then offers to go on.
        monkeypatch.setattr("orbit_node.api.console.bulk.MAX_BULK", 3)
        await sign_in(client, tenant.token)
        confirm = await client.get("/console/tasks/bulk/cancel?handler=other&queue_id=" + q1)
        assert bulk_count(confirm.text) == 2 and 'id="bulk-more"' not in confirm.text
        confirm = await client.get("/console/tasks/bulk/retry?state=cancelled")
        assert bulk_count(confirm.text) == 3 and 'id="bulk-more"' in confirm.text
        done = await client.post("/console/tasks/bulk/retry", data=as_form(hidden_fields(confirm.text)))
        assert "changed=3" in done.headers["location"] and "more=retry&more_cursor=" in done.headers["location"]
        go_on = re.search(
            r'<p class="notice" id="go-on">.*?<a href="([^"]+)">', (await client.get(done.headers["location"])).text
        )
        rest = await client.get(unescape(go_on.group(1)))
        assert bulk_count(rest.text) == 2 and ("cursor", "") not in hidden_fields(rest.text)
        done = await client.post("/console/tasks/bulk/retry", data=as_form(hidden_fields(rest.text)))
        assert "changed=2" in done.headers["location"] and "more=" not in done.headers["location"]

    audited = [(r["action"], r["changed"], r["queue_id"], json.loads(r["filter"])) for r in await audit_rows(db)]
    assert [a[:3] for a in audited] == [
        ("tasks.bulk_cancel", 5, None),
        ("tasks.bulk_retry", 5, None),
        ("tasks.bulk_retry", 0, None),
        ("tasks.bulk_retry", 3, None),
        ("tasks.bulk_retry", 2, None),
    ]
    first = audited[0][3]
    assert (first["handler"], first["state"]) == ("h", ["waiting", "queued", "reserved", "running"])
    assert "created_before" in first and "cursor" in audited[-1][3]
    assert (await seed.count_states(db)).get("queued") == 3 + 5 + 5


async def test_a_write_done_whose_audit_record_cannot_be_written_says_so(running_node, db):
    tenant = await make_tenant(db)
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        token = await token_of(client)
        # The audit table is out of reach (as a lost privilege or a broken table would be).
        await db.run(lambda tx: tx.execute_raw("RENAME TABLE audit_records TO audit_records_away"))
        try:
            done = await client.post(f"/console/queues/{tenant.queue_id}/pause", data={FORM: token})
        finally:
            await db.run(lambda tx: tx.execute_raw("RENAME TABLE audit_records_away TO audit_records"))
        assert done.headers["location"] == f"/console/queues/{tenant.queue_id}?done=paused&unrecorded=1"
        shown = (await client.get(done.headers["location"])).text
        assert "Queue paused" in shown and "Its audit record could not be written" in shown
    assert (await TenancyStore(db).get_queue(tenant.namespace_id, tenant.queue_id)).paused
    assert await audit_rows(db) == []
