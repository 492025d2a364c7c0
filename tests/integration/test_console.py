"""The console over HTTP: sessions, scopes, escaping, security headers, live panels.

The browser tests (tests/system/test_console_browser.py) drive the same pages in Chromium; these
check each rule directly on the responses of a real node.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import attrs
import httpx
import pytest
from itsdangerous import TimestampSigner

from orbit_node.api.console import model
from orbit_node.api.console.session import COOKIE_NAME, SessionSigner
from orbit_node.config import NodeConfig
from orbit_node.domain.errors import ConfigError
from orbit_node.services import default_services
from orbit_node.store.operations import OperationsStore
from orbit_node.store.plans import PlanStore
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..nodeutil import make_tenant, make_token, run_node
from ..wsclient import raw_worker

MISSING = "0" * 32


def console(node, **kwargs) -> httpx.AsyncClient:
    return node.client(follow_redirects=False, **kwargs)


async def sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    response = await client.post("/console/sign-in", data={"token": token})
    assert response.status_code == 303, response.text
    return response


def main_of(html: str) -> str:
    return html[html.index("<main>") : html.index("</main>")]


def submit(queue_id: str, payload: object = None, priority: int = 0, **more: object) -> dict:
    return {
        "queue_id": queue_id,
        "handler": "h",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {} if payload is None else payload,
        "priority": priority,
        **more,
    }


async def test_sign_in_sets_a_strict_http_only_cookie_and_pages_carry_the_security_headers(running_node, db):
    tenant = await make_tenant(db)
    async with console(running_node) as client:
        response = await sign_in(client, tenant.token)
        assert response.headers["location"] == "/console"
        cookie = response.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE_NAME}=")
        attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "path", "max-age", "samesite"} <= attributes
        assert "SameSite=Strict" in cookie and "Path=/console" in cookie and "Max-Age=28800" in cookie
        assert "secure" not in attributes  # plain HTTP: a Secure cookie would never come back
        assert tenant.token not in cookie  # the cookie names the credential, never its token

        for path in ("/console", "/console/static/console.js", "/console/sign-in"):
            page = await client.get(path)
            assert page.status_code == 200, path
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
            assert "unsafe-inline" not in policy
            assert page.headers["x-content-type-options"] == "nosniff", path
        overview = await client.get("/console")
        assert overview.headers["cache-control"] == "no-store"
        # No inline script: every <script> names a file of the console.
        scripts = re.findall(r"<script[^>]*>(.*?)</script>", overview.text, flags=re.S)
        assert scripts == [""]
        assert '<script src="/console/static/console.js" defer>' in overview.text


async def test_without_a_valid_session_pages_go_to_sign_in_and_panels_answer_401(running_node, db):
    tenant = await make_tenant(db)
    async with console(running_node) as client:
        page = await client.get("/console/workers")
        assert (page.status_code, page.headers["location"]) == (303, "/console/sign-in?next=%2Fconsole%2Fworkers")
        panel = await client.get("/console?fragment=live")
        assert panel.status_code == 401 and panel.headers["orbit-sign-in"] == "/console/sign-in"

        # A cookie signed with another key, a tampered one, and one of a past session are refused.
        credential_id = tenant.token[4:36]
        foreign = SessionSigner(b"k" * 32, 3600).issue(credential_id)
        for value in (foreign, "garbage", foreign[:-2] + "xx"):
            client.cookies.set(COOKIE_NAME, value, path="/console")
            refused = await client.get("/console")
            assert (refused.status_code, refused.headers["location"]) == (303, "/console/sign-in?ended=expired")
            assert f"{COOKIE_NAME}=" in refused.headers["set-cookie"] and "Max-Age=0" in refused.headers["set-cookie"]

        bad = await client.post("/console/sign-in", data={"token": "orb_" + "0" * 96})
        assert bad.status_code == 401 and "unknown or revoked credential" in bad.text
        empty = await client.post("/console/sign-in", data={"token": " "})
        assert empty.status_code == 400 and "token: paste" in empty.text
        submit_only = await make_token(db, tenant, {"tasks:submit": "*"})
        lacking = await client.post("/console/sign-in", data={"token": submit_only})
        assert lacking.status_code == 403 and "lacks scope tasks:read" in lacking.text
        assert "set-cookie" not in lacking.headers
        cross_site = await client.post(
            "/console/sign-in", data={"token": tenant.token}, headers={"Origin": "https://evil.example"}
        )
        assert cross_site.status_code == 403 and "set-cookie" not in cross_site.headers


def test_a_session_expires_after_its_lifetime():
    class Clock(SessionSigner):
        now = 1_000_000

        def _signer(self) -> TimestampSigner:
            signer = super()._signer()
            signer.get_timestamp = lambda: Clock.now  # type: ignore[method-assign]
            return signer

    signer = Clock(b"s" * 32, 60)
    value = signer.issue("a" * 32)
    Clock.now += 60
    assert signer.credential_id(value) == "a" * 32
    Clock.now += 1
    assert signer.credential_id(value) is None
    with pytest.raises(ValueError):
        signer.issue("not-an-id")


async def test_a_revoked_credential_loses_its_session_at_the_next_request(running_node, db):
    tenant = await make_tenant(db)
    credential_id, token = await TenancyStore(db).create_credential(tenant.namespace_id, "viewer", {"tasks:read": "*"})
    async with console(running_node) as client, console(running_node) as second:
        await sign_in(client, token)
        await sign_in(second, token)
        assert (await client.get("/console")).status_code == 200
        assert (await client.get("/console?fragment=live")).status_code == 200
        await TenancyStore(db).revoke_credential(credential_id)
        panel = await client.get("/console?fragment=live")
        assert panel.status_code == 401 and panel.headers["orbit-sign-in"] == "/console/sign-in?ended=revoked"
        assert "Max-Age=0" in panel.headers["set-cookie"]
        page = await second.get("/console/fairness")
        assert page.headers["location"] == "/console/sign-in?ended=revoked&next=%2Fconsole%2Ffairness"
        ended = await client.get("/console/sign-in?ended=revoked")
        assert "its credential is unknown, revoked" in ended.text
        assert (await client.post("/console/sign-in", data={"token": token})).status_code == 401


def form_token(html: str) -> str:
    """The session's form token, as a page's forms carry it."""
    found = set(re.findall(r'name="csrf_token" value="([^"]*)"', html))
    assert len(found) == 1, found
    return found.pop()


async def test_sign_out_clears_the_cookie(running_node, db):
    tenant = await make_tenant(db)
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        # Without the session's form token (a post from another site) the session stays.
        refused = await client.post("/console/sign-out")
        assert refused.status_code == 403 and "csrf_token" in refused.text
        assert (await client.get("/console")).status_code == 200
        token = form_token((await client.get("/console")).text)
        out = await client.post("/console/sign-out", data={"csrf_token": token})
        assert (out.status_code, out.headers["location"]) == (303, "/console/sign-in?ended=signed-out")
        assert "Max-Age=0" in out.headers["set-cookie"]
        assert (await client.get("/console")).status_code == 303


async def test_each_sign_in_has_its_own_session_and_a_signed_out_cookie_is_refused_on_every_node(node_config, db):
    """A copied cookie of a session that signed out opens nothing, on the node it signed
    out on or another sharing the key; two sign-ins within a second get two cookies and
    two form tokens; the other session of the same credential goes on."""
    tenant = await make_tenant(db)
    shared = attrs.evolve(node_config, console_secret="s" * 40)
    async with run_node(shared) as one, run_node(shared) as two:
        async with console(one) as first, console(one) as second:
            a = (await sign_in(first, tenant.token)).cookies[COOKIE_NAME]
            b = (await sign_in(second, tenant.token)).cookies[COOKIE_NAME]
            assert a != b
            token_a = form_token((await first.get("/console")).text)
            token_b = form_token((await second.get("/console")).text)
            assert token_a != token_b
            out = await first.post("/console/sign-out", data={"csrf_token": token_a})
            assert out.status_code == 303
            assert (await second.get("/console")).status_code == 200, "the other session goes on"
        for node in (one, two):
            async with console(node) as copied:
                copied.cookies.set(COOKIE_NAME, a, path="/console")
                refused = await copied.get("/console")
                assert (refused.status_code, refused.headers["location"]) == (303, "/console/sign-in?ended=signed-out")
                panel = await copied.get("/console?fragment=live")
                assert panel.status_code == 401


async def test_overview_shows_the_backlog_per_priority_and_the_panel_answers_304_until_it_changes(running_node, db):
    tenant = await make_tenant(db, queues=("work", "idle"))
    async with console(running_node) as client, running_node.client(tenant.token) as api:
        await sign_in(client, tenant.token)
        # Not due for an hour: nothing on the panel ages while it is watched.
        for n, priority in enumerate((9, 9, 4)):
            task = submit(tenant.queues["work"], priority=priority, delay_s=3600)
            created = await api.post("/v1/tasks", json=task, headers={"Idempotency-Key": f"k{n}"})
            assert created.status_code == 201
        assert (await api.post("/v1/queues/" + tenant.queues["idle"] + "/pause", json={})).status_code == 200
        panel = await client.get("/console?fragment=live")
        assert panel.status_code == 200 and "<html" not in panel.text
        work = row_of(panel.text, tenant.queues["work"])
        assert 'data-queued="3"' in work
        assert counts(work) == {9: 2, 4: 1}
        assert "paused" in row_of(panel.text, tenant.queues["idle"])
        tag = panel.headers["etag"]
        same = await client.get("/console?fragment=live", headers={"If-None-Match": tag})
        assert same.status_code == 304 and same.text == ""
        task = submit(tenant.queues["work"], priority=0, delay_s=3600)
        assert (await api.post("/v1/tasks", json=task, headers={"Idempotency-Key": "k9"})).status_code == 201
        changed = await client.get("/console?fragment=live", headers={"If-None-Match": tag})
        assert changed.status_code == 200 and changed.headers["etag"] != tag
        assert counts(row_of(changed.text, tenant.queues["work"])) == {9: 2, 4: 1, 0: 1}


def row_of(html: str, queue_id: str) -> str:
    start = html.index(f'<tr data-queue-id="{queue_id}"')
    return html[start : html.index("</tr>", start)]


def counts(html: str) -> dict[int, int]:
    found = re.findall(r'data-level="(\d)" data-count="(\d+)"', html)
    return {int(level): int(n) for level, n in found if int(n)}


async def test_overview_shows_the_application_s_retention_per_outcome_and_where_it_comes_from(running_node, db):
    tenant = await make_tenant(db)
    retention = re.compile(r'<dd class="retention" data-class="(\w+)" data-default="(\w+)">([^<]*)</dd>')
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        assert retention.findall((await client.get("/console")).text) == [
            ("succeeded", "yes", "1d (the node's default)"),
            ("failed", "yes", "7d (the node's default)"),
        ]
        await OperationsStore(db).patch_retention("app", {"failed": "36h"})
        page = (await client.get("/console")).text
        assert retention.findall(page) == [("succeeded", "yes", "1d (the node's default)"), ("failed", "no", "36h")]
        assert "failed and cancelled and expired tasks kept for" not in page
        assert "failed, cancelled and expired tasks kept for" in page


async def test_tenant_input_is_shown_escaped(running_node, db):
    tenant = await make_tenant(db)
    markup = "<script>alert(1)</script><b>bold</b>"
    async with console(running_node) as client, running_node.client(tenant.token) as api:
        await sign_in(client, tenant.token)
        created = await api.post(
            "/v1/tasks", json=submit(tenant.queue_id, {"note": markup}), headers={"Idempotency-Key": "x"}
        )
        task_id = created.json()["data"]["task_id"]
        page = await client.get(f"/console/tasks/{task_id}")
        assert page.status_code == 200
        assert markup not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in page.text


async def test_another_tenants_ids_render_the_page_of_a_missing_one(running_node, db):
    tenant = await make_tenant(db)
    other = await make_tenant(db, "other")
    async with running_node.client(other.token) as api:
        task_id = (await api.post("/v1/tasks", json=submit(other.queue_id), headers={"Idempotency-Key": "o"})).json()[
            "data"
        ]["task_id"]
    plan = await PlanStore(db).create(other.namespace_id, other.queue_id, "nightly")
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        for kind, foreign in (("queues", other.queue_id), ("tasks", task_id), ("plans", plan.plan_id)):
            theirs = await client.get(f"/console/{kind}/{foreign}")
            missing = await client.get(f"/console/{kind}/{MISSING}")
            malformed = await client.get(f"/console/{kind}/not-an-id")
            assert theirs.status_code == missing.status_code == malformed.status_code == 404, kind
            assert theirs.text == missing.text == malformed.text, kind
            assert foreign not in theirs.text
        overview = await client.get("/console")
        assert other.queue_id not in overview.text and "other" not in main_of(overview.text)


async def test_the_queue_page_shows_how_many_tasks_of_a_resource_key_may_run(running_node, db):
    tenant = await make_tenant(db)
    async with running_node.client(tenant.token) as api:
        changed = await api.patch(f"/v1/queues/{tenant.queue_id}/controls", json={"max_running_per_key": 3})
        assert changed.status_code == 200, changed.text
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        page = main_of((await client.get(f"/console/queues/{tenant.queue_id}")).text)
    assert '<dd id="running-per-key">at most 3 reserved or running at once</dd>' in page


async def test_a_grant_limited_to_one_queue_shows_that_queue_only(running_node, db):
    tenant = await make_tenant(db, queues=("seen", "hidden"))
    token = await make_token(db, tenant, {"tasks:read": [tenant.queues["seen"]]})
    async with running_node.client(tenant.token) as api:
        hidden_task = (
            await api.post("/v1/tasks", json=submit(tenant.queues["hidden"]), headers={"Idempotency-Key": "h"})
        ).json()["data"]["task_id"]
    async with console(running_node) as client:
        await sign_in(client, token)
        overview = await client.get("/console")
        assert tenant.queues["seen"] in overview.text and tenant.queues["hidden"] not in overview.text
        # Like the API: the namespace's own queue outside the grant is 403, not 404.
        assert (await client.get(f"/console/queues/{tenant.queues['hidden']}")).status_code == 403
        assert (await client.get(f"/console/tasks/{hidden_task}")).status_code == 403
        assert hidden_task not in (await client.get("/console/tasks")).text


async def test_fairness_shows_every_application_only_with_metrics_read(running_node, db):
    alpha = await make_tenant(db, "alpha")
    beta = await make_tenant(db, "beta")
    node_id = "f" * 32
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO nodes (node_id, hostname, http_addr, version) VALUES (%s, 'h', 'a', 'v')", (node_id,)
        )
    )
    for application_id, turns in ((alpha.application_id, 30), (beta.application_id, 10)):
        await db.run(
            lambda tx, a=application_id, t=turns: tx.execute_raw(
                "INSERT INTO claim_turns (node_id, application_id, turns) VALUES (%s, %s, %s)", (node_id, a, t)
            )
        )
    operator = await make_token(db, alpha, {"tasks:read": "*", "metrics:read": "*"})
    reader = await make_token(db, alpha, {"tasks:read": "*"})
    async with console(running_node) as client:
        await sign_in(client, reader)
        own = await client.get("/console/fairness")
        assert 'data-application="alpha" data-turns="30"' in own.text
        assert "beta" not in own.text and 'id="own-only"' in own.text and " %" not in own.text
        await sign_in(client, operator)
        every = await client.get("/console/fairness")
        assert 'data-application="beta" data-turns="10"' in every.text
        assert "75.0 %" in every.text and "25.0 %" in every.text and 'id="own-only"' not in every.text


async def test_fairness_sets_the_share_of_turns_against_the_weights_share_per_node_and_across_nodes(running_node, db):
    alpha = await make_tenant(db, "alpha")
    beta = await make_tenant(db, "beta")
    await OperationsStore(db).set_weight("alpha", 3)
    one, two = "1" * 32, "2" * 32
    turns = [(one, alpha, 30), (one, beta, 10), (two, alpha, 5), (two, beta, 15)]
    for node_id in (one, two):
        await db.run(
            lambda tx, n=node_id: tx.execute_raw(
                "INSERT INTO nodes (node_id, hostname, http_addr, version) VALUES (%s, 'h', 'a', 'v')", (n,)
            )
        )
    for node_id, tenant, count in turns:
        await db.run(
            lambda tx, n=node_id, a=tenant.application_id, t=count: tx.execute_raw(
                "INSERT INTO claim_turns (node_id, application_id, turns) VALUES (%s, %s, %s)", (n, a, t)
            )
        )
    minute = "INSERT INTO claim_turn_minutes (application_id, minute, node_id, turns) VALUES (%s, NOW() - INTERVAL SECOND(NOW()) SECOND, %s, %s)"
    for tenant, count in ((alpha, 6), (beta, 4)):
        await db.run(lambda tx, a=tenant.application_id, t=count: tx.execute_raw(minute, (a, one, t)))
    operator = await make_token(db, alpha, {"tasks:read": "*", "metrics:read": "*"})
    reader = await make_token(db, alpha, {"tasks:read": "*"})
    across = re.compile(
        r'<tr class="app-turns" data-application-id="\w+" data-application="(\w+)" data-turns="(\d+)" '
        r'data-weight="(\d+)"(?: data-share="([\d.]+)" data-weight-share="([\d.]+)")?>'
    )
    per_node = re.compile(
        r'<tr class="node-app-turns" data-application-id="(\w+)" data-turns="(\d+)" data-weight="(\d+)"'
        r'(?: data-share="([\d.]+)" data-weight-share="([\d.]+)")?>'
    )

    def tables(html: str) -> dict[str, list[tuple[str, ...]]]:
        found = {}
        for node_id, body in re.findall(
            r'<table class="turns node-turns" data-node-id="(\w+)">(.*?)</table>', html, re.S
        ):
            names = {alpha.application_id: "alpha", beta.application_id: "beta"}
            found[node_id] = [(names[a], *rest) for a, *rest in per_node.findall(body)]
        return found

    async with console(running_node) as client:
        await sign_in(client, operator)
        page = await client.get("/console/fairness")
        assert page.status_code == 200
        # Every node: alpha has 35 of 60 turns where its weight 3 of 4 gives it 75 %.
        assert across.findall(page.text) == [
            ("alpha", "35", "3", "0.5833", "0.7500"),
            ("beta", "25", "1", "0.4167", "0.2500"),
        ]
        # Per node: node one follows the weights, node two does not (alpha asked little there).
        assert tables(page.text) == {
            one: [("alpha", "30", "3", "0.7500", "0.7500"), ("beta", "10", "1", "0.2500", "0.2500")],
            two: [("alpha", "5", "3", "0.2500", "0.7500"), ("beta", "15", "1", "0.7500", "0.2500")],
        }
        assert "alpha: 6 turns, 60.0 %; weight 3 gives 75.0 %" in page.text
        assert "beta: 4 turns, 40.0 %; weight 1 gives 25.0 %" in page.text
        overview = await client.get("/console")
        assert '<dd id="fairness-weight">3</dd>' in overview.text
        # Without metrics:read: its own application's weight, no shares, nothing of the others.
        await sign_in(client, reader)
        own = await client.get("/console/fairness")
        assert across.findall(own.text) == [("alpha", "35", "3", "", "")]
        assert tables(own.text) == {one: [("alpha", "30", "3", "", "")], two: [("alpha", "5", "3", "", "")]}
        assert "alpha: 6 turns, weight 3" in own.text and "beta" not in own.text and " %" not in own.text


async def test_fairness_history_covers_the_last_minutes_of_every_node(running_node, db):
    """Minute rows of two nodes (written with chosen times, as nodes write them) are summed
    per application; rows older than the window are left out; tenants see only their own."""
    alpha = await make_tenant(db, "alpha")
    beta = await make_tenant(db, "beta")
    rows = [
        (alpha.application_id, 0, "1" * 32, 6),
        (alpha.application_id, 0, "2" * 32, 4),
        (alpha.application_id, 3, "1" * 32, 5),
        (beta.application_id, 0, "1" * 32, 10),
        (beta.application_id, 30, "1" * 32, 1000),  # outside the 15 minutes shown
    ]
    for application_id, ago, node_id, turns in rows:
        await db.run(
            lambda tx, a=application_id, m=ago, n=node_id, t=turns: tx.execute_raw(
                "INSERT INTO claim_turn_minutes (application_id, minute, node_id, turns)"
                " VALUES (%s, NOW() - INTERVAL SECOND(NOW()) SECOND - INTERVAL %s MINUTE, %s, %s)",
                (a, m, n, t),
            )
        )
    operator = await make_token(db, alpha, {"tasks:read": "*", "metrics:read": "*"})
    reader = await make_token(db, alpha, {"tasks:read": "*"})
    legend = re.compile(r'<li data-application-id="(\w+)" data-turns="(\d+)">.*?</li>', re.S)
    async with console(running_node) as client:
        await sign_in(client, operator)
        page = await client.get("/console/fairness")
        assert dict(legend.findall(page.text)) == {alpha.application_id: "15", beta.application_id: "10"}
        assert "alpha: 15 turns, 60.0 %" in page.text and "beta: 10 turns, 40.0 %" in page.text
        assert page.text.count("<polyline ") == 2
        await sign_in(client, reader)
        own = await client.get("/console/fairness")
        assert dict(legend.findall(own.text)) == {alpha.application_id: "15"} and "beta" not in own.text


async def test_workers_of_the_namespace_with_capacity_and_held_tasks(node_config, db):
    tenant = await make_tenant(db)
    other = await make_tenant(db, "other")
    await seed.insert_tasks(
        db, seed.Tenant(tenant.application_id, tenant.namespace_id, tenant.queue_id), [seed.TaskSpec()] * 2
    )
    async with run_node(node_config, services=default_services()) as node, run_node(node_config) as viewer:
        async with raw_worker(node.base_url, tenant.token) as mine, raw_worker(node.base_url, other.token) as theirs:
            await mine.hello([tenant.queue_id], capacity=5)
            assert len((await mine.recv_type("dispatch"))["tasks"]) == 2
            await theirs.hello([other.queue_id], capacity=3)
            for serving, this_node in ((node, True), (viewer, False)):
                async with console(serving) as client:
                    await sign_in(client, tenant.token)
                    page = await client.get("/console/workers")
                    assert page.status_code == 200
                    rows = re.findall(r'<tr data-connection-id="([^"]+)" data-held="(\d+)">(.*?)</tr>', page.text, re.S)
                    assert len(rows) == 1 and rows[0][1] == "2"
                    # The capacity of the hello, from the registry: the same on every node.
                    assert '<td class="n">5</td>' in rows[0][2]
                    assert ("(this node)" in page.text) is this_node and ">q1</a>" in rows[0][2]
                    # Connections per application of the node serving the page (a node-wide
                    # credential sees every application and its fair share).
                    slots = re.findall(r'<tr data-application-id="([^"]+)" data-connections="(\d+)">', page.text)
                    if this_node:
                        assert sorted(slots) == sorted([(tenant.application_id, "1"), (other.application_id, "1")])
                        assert "fair share when full" in page.text
                    else:
                        assert slots == []  # a node without Workers shows no slots


async def test_console_off_and_a_short_secret_are_settings(node_config):
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://root@h/d", "ORBIT_CONSOLE_SECRET": "short"})
    assert info.value.field == "ORBIT_CONSOLE_SECRET"
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://root@h/d", "ORBIT_CONSOLE": "maybe"})
    assert info.value.field == "ORBIT_CONSOLE"
    config = NodeConfig.from_env(
        {"ORBIT_MYSQL_DSN": "mysql://root@h/d", "ORBIT_CONSOLE_SECRET": "x" * 32, "ORBIT_CONSOLE_SESSION_S": "60"}
    )
    assert (config.console, config.console_session_s) == (True, 60.0) and "x" * 32 not in repr(config)
    async with run_node(attrs.evolve(node_config, console=False)) as node, node.client() as client:
        assert (await client.get("/console")).status_code == 404


async def test_nodes_sharing_a_secret_accept_each_others_sessions(node_config, db):
    tenant = await make_tenant(db)
    shared = attrs.evolve(node_config, console_secret="s" * 40)
    async with run_node(shared) as one, run_node(shared) as two, run_node(node_config) as alone:
        async with console(one) as client:
            cookie = (await sign_in(client, tenant.token)).cookies[COOKIE_NAME]
        for node, status in ((two, 200), (alone, 303)):
            async with console(node) as client:
                client.cookies.set(COOKIE_NAME, cookie, path="/console")
                assert (await client.get("/console")).status_code == status


def test_priority_bars_are_relative_to_the_largest_level():
    bars = model.priority_bars({9: 10, 4: 5, 0: 1})
    assert [b.level for b in bars] == list(range(9, -1, -1))
    heights = {b.level: b.height for b in bars}
    assert (heights[9], heights[4], heights[0], heights[5]) == (model.BAR_HEIGHT, model.BAR_HEIGHT // 2, 4, 0)
    assert all(b.height == 0 for b in model.priority_bars({}))
    assert model.priority_bars({3: 1000, 2: 1})[7].height == 1  # a level with tasks stays visible


def test_turn_history_buckets_minutes_and_scales_to_the_peak():
    now = datetime(2030, 1, 1, 12, 0)
    rows = [
        {"application_id": "a", "application": "alpha", "minute": now, "turns": 8, "current_minute": now},
        {
            "application_id": "a",
            "application": "alpha",
            "minute": now - timedelta(minutes=2),
            "turns": 4,
            "current_minute": now,
        },
        {
            "application_id": "b",
            "application": "beta",
            "minute": now - timedelta(minutes=99),
            "turns": 50,
            "current_minute": now,
        },
    ]
    history = model.turn_history(rows, own_application_id="a", node_wide=True, minutes=4)
    assert history.peak == 8 and [s.application for s in history.series] == ["alpha"]
    (alpha,) = history.series
    ys = [float(point.split(",")[1]) for point in alpha.points.split()]
    assert len(ys) == 5 and ys[-1] == model.CHART_TOP and ys[0] == model.CHART_BOTTOM
    assert ys[2] == (model.CHART_TOP + model.CHART_BOTTOM) / 2  # 4 of 8, two minutes ago
    assert (alpha.total, alpha.share) == (12, 1.0)
    hidden = model.turn_history(rows, own_application_id="b", node_wide=False, minutes=4)
    assert hidden.series == [] and hidden.peak == 0


def test_application_turns_hide_other_tenants_without_a_node_wide_grant():
    rows = [
        {"node_id": "n1", "application_id": "a", "application": "alpha", "turns": 3},
        {"node_id": "n2", "application_id": "a", "application": "alpha", "turns": 3},
        {"node_id": "n1", "application_id": "b", "application": "beta", "turns": 2},
    ]
    every = model.application_turns(rows, own_application_id="a", node_wide=True)
    assert [(a.application, a.turns, a.nodes, a.share) for a in every] == [("alpha", 6, 2, 0.75), ("beta", 2, 1, 0.25)]
    own = model.application_turns(rows, own_application_id="a", node_wide=False)
    assert [(a.application, a.turns, a.share) for a in own] == [("alpha", 6, None)]


def test_each_node_s_turns_are_set_against_the_weights_of_the_applications_it_served():
    rows = [
        {"node_id": "n1", "application_id": "a", "application": "alpha", "fairness_weight": 3, "turns": 9},
        {"node_id": "n1", "application_id": "b", "application": "beta", "fairness_weight": 1, "turns": 3},
        {"node_id": "n2", "application_id": "b", "application": "beta", "fairness_weight": 1, "turns": 4},
        {"node_id": "n2", "application_id": "c", "application": "gone", "fairness_weight": None, "turns": 4},
    ]
    nodes = model.node_turns(rows, own_application_id="a", node_wide=True)
    assert [
        (n.node_id, [(a.application, a.turns, a.weight, a.share, a.weight_share) for a in n.applications])
        for n in nodes
    ] == [
        ("n1", [("alpha", 9, 3, 0.75, 0.75), ("beta", 3, 1, 0.25, 0.25)]),
        ("n2", [("beta", 4, 1, 0.5, 0.5), ("gone", 4, 1, 0.5, 0.5)]),
    ]
    every = model.application_turns(rows, own_application_id="a", node_wide=True)
    assert [(a.application, a.weight, a.weight_share) for a in every] == [
        ("alpha", 3, 0.6),
        ("beta", 1, 0.2),
        ("gone", 1, 0.2),
    ]
    # Without a node-wide grant: the own application on the nodes that served it, no shares.
    own = model.node_turns(rows, own_application_id="a", node_wide=False)
    assert [(n.node_id, [(a.turns, a.weight, a.weight_share) for a in n.applications]) for n in own] == [
        ("n1", [(9, 3, None)])
    ]


def test_connection_slots_show_the_own_application_or_every_one_with_its_share():
    held = {"a": 3, "b": 1}
    weights = {"a": 1, "b": 1, "c": 2}.__getitem__
    common = {"slots": 4, "names": {"a": "alpha", "b": "beta"}, "weight": weights}
    every = model.connection_slots(held, **common, own_application_id="c", own_application="gamma", node_wide=True)
    assert [(r.application, r.connections, r.weight, r.share) for r in every] == [
        ("alpha", 3, 1, 1.0),
        ("beta", 1, 1, 1.0),
        ("gamma", 0, 2, 2.0),
    ]
    own = model.connection_slots(held, **common, own_application_id="a", own_application="alpha", node_wide=False)
    assert [(r.application, r.connections, r.weight, r.share) for r in own] == [("alpha", 3, 1, None)]


def test_visible_workers_keep_the_readable_queues_only():
    worker = {
        "connection_id": "c1",
        "node_id": "n",
        "hostname": "h",
        "http_addr": "a",
        "queues": ["q1", "q2"],
        "capacity": 4,
    }
    shown = model.visible_workers([worker], readable=["q2"], queue_names={"q2": "two"})
    assert shown[0]["connections"][0]["queues"] == [{"queue_id": "q2", "name": "two"}]
    assert shown[0]["connections"][0]["capacity"] == 4
    assert model.visible_workers([worker], readable=["q3"], queue_names={}) == []


def test_durations_read_as_words():
    assert [model.duration(s) for s in (None, 0.25, 4.2, 42, 185, 7800, 200000)] == [
        "-",
        "250 ms",
        "4.2 s",
        "42 s",
        "3 min 5 s",
        "2 h 10 min",
        "2 d 7 h",
    ]


async def test_a_task_page_draws_its_family_with_links(running_node, db):
    tenant = await make_tenant(db)
    async with console(running_node) as client, running_node.client(tenant.token) as api:
        await sign_in(client, tenant.token)
        ids = {}
        for key in ("p1", "p2"):
            ids[key] = (
                await api.post("/v1/tasks", json=submit(tenant.queue_id), headers={"Idempotency-Key": key})
            ).json()["data"]["task_id"]
        middle = {**submit(tenant.queue_id), "depends_on": [ids["p1"], ids["p2"]]}
        ids["m"] = (await api.post("/v1/tasks", json=middle, headers={"Idempotency-Key": "m"})).json()["data"][
            "task_id"
        ]
        last = {**submit(tenant.queue_id), "depends_on": [ids["m"]]}
        ids["c"] = (await api.post("/v1/tasks", json=last, headers={"Idempotency-Key": "c"})).json()["data"]["task_id"]
        page = (await client.get(f"/console/tasks/{ids['m']}")).text
        family = page[page.index('id="family"') :]
        for key in ("p1", "p2", "c"):
            assert f'href="/console/tasks/{ids[key]}"' in family, key
        assert family.count("<rect") == 4 and family.count("<line") == 3
        assert 'data-code="WAITING_FOR_PARENTS"' in page
        alone = (await client.get(f"/console/tasks/{ids['p1']}")).text
        assert alone.count("<rect") == 2
