"""orbit-admin beyond bootstrap, as an operator runs it, against a real MariaDB: credentials
with chosen scopes, quota, suspend/resume, queue backlogs, tasks, explanations, top; and
every failure (unknown task, missing scope, database down) as one line and a non-zero exit."""

from __future__ import annotations

import functools
import json
import os
import stat

import attrs
import pytest
import trio

from orbit_node.config import SchedulerLimits
from orbit_node.services import default_services
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..helpers import cli
from ..nodeutil import make_tenant, run_node
from ..wsclient import raw_worker
from .test_metrics import ClaimWatch

# A whole test on the real clock (subprocesses, nodes, a database).
TEST_TIMEOUT_S = 90
# Nothing listens on port 1: connections are refused at once.
DOWN_DSN = "mysql://root@127.0.0.1:1/orbit"


async def admin(*args: str, dsn=None, env: dict | None = None):
    """Run orbit-admin in a thread (a node in this process keeps serving meanwhile)."""
    return await trio.to_thread.run_sync(functools.partial(cli, "orbit-admin", *args, dsn=dsn, env=env))


async def admin_json(*args: str, dsn) -> object:
    result = await admin(*args, "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result, code: int = 1) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def task_body(queue_id: str) -> dict:
    return {"queue_id": queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {}}


async def bootstrap(dsn, tmp_path, application="shop", queues=("orders", "refunds")) -> dict:
    out = tmp_path / f"{application}.json"
    args = [
        "bootstrap",
        "--application",
        application,
        "--namespace",
        "default",
        "--environment",
        "test",
        "--output",
        str(out),
    ]
    for queue in queues:
        args += ["--queue", queue]
    result = await admin(*args, dsn=dsn)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


# -- credentials -------------------------------------------------------------------------


@pytest.fixture
def node_config(node_config):
    # Revocations here must hold on the very next request: no cache of verified credentials.
    return attrs.evolve(node_config, credential_cache_s=0.0)


async def test_a_credential_gets_exactly_the_chosen_scopes_and_revoking_it_stops_it(running_node, dsn, tmp_path):
    boot = await bootstrap(dsn, tmp_path)
    orders, refunds = boot["queues"]["orders"], boot["queues"]["refunds"]
    with trio.fail_after(TEST_TIMEOUT_S):
        created = await admin_json(
            "credential",
            "create",
            "--application",
            "shop",
            "--namespace",
            "default",
            "--scope",
            "tasks:read",
            "--scope",
            "tasks:submit=orders",
            "--name",
            "reader",
            dsn=dsn,
        )
        assert created["scopes"] == {"tasks:read": "*", "tasks:submit": [orders]}
        token = created["token"]
        async with running_node.client(token) as client:
            assert (
                await client.post("/v1/tasks", json=task_body(orders), headers={"Idempotency-Key": "a"})
            ).status_code == 201
            refused = await client.post("/v1/tasks", json=task_body(refunds), headers={"Idempotency-Key": "b"})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "PERMISSION_DENIED"
            assert (await client.get("/v1/tasks")).status_code == 200
            missing = await client.post("/v1/queues", json={"name": "third"})
            assert missing.status_code == 403 and "queues:manage" in missing.json()["error"]["message"]

        listed = await admin("credential", "list", "--application", "shop", "--json", dsn=dsn)
        assert listed.returncode == 0, listed.stderr
        assert token not in listed.stdout and token[36:] not in listed.stdout
        rows = {r["credential_id"]: r for r in json.loads(listed.stdout)}
        assert len(rows) == 2 and rows[created["credential_id"]]["name"] == "reader"
        assert rows[created["credential_id"]]["revoked_at"] is None

        revoked = await admin("credential", "revoke", created["credential_id"], dsn=dsn)
        assert revoked.returncode == 0 and created["credential_id"] in revoked.stdout
        async with running_node.client(token) as client:
            assert (await client.get("/v1/tasks")).status_code == 401
        # Revoking twice is fine; the listing shows when.
        assert (await admin("credential", "revoke", created["credential_id"], dsn=dsn)).returncode == 0
        rows = {
            r["credential_id"]: r
            for r in await admin_json("credential", "list", "--application", "shop", "--namespace", "default", dsn=dsn)
        }
        assert rows[created["credential_id"]]["revoked_at"] is not None

        text = await admin("credential", "list", "--application", "shop", dsn=dsn)
        assert text.returncode == 0 and "reader" in text.stdout and "tasks:submit (1 queue)" in text.stdout


async def test_credential_errors_are_one_line_and_change_nothing(dsn, db, tmp_path):
    await bootstrap(dsn, tmp_path)
    base = ["credential", "create", "--application", "shop", "--namespace", "default"]
    before = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM credentials"))
    cases = [
        (["--scope", "tasks:write"], "INVALID_ARGUMENT: --scope: unknown scope 'tasks:write'"),
        (["--scope", "metrics:read=orders"], "INVALID_ARGUMENT: --scope: metrics:read is node-wide"),
        (["--scope", "tasks:read=nosuch"], "NOT_FOUND: --scope: no queue named 'nosuch'"),
        (["--scope", "tasks:read", "--scope", "tasks:read=orders"], "INVALID_ARGUMENT: --scope: tasks:read given more"),
    ]
    for extra, message in cases:
        line = one_line_error(await admin(*base, *extra, dsn=dsn))
        assert line.startswith(f"error: {message}"), line
    # Without any --scope: a usage error (exit 2).
    line = one_line_error(await admin(*base, dsn=dsn), 2)
    assert "the following arguments are required: --scope" in line
    line = one_line_error(
        await admin(
            "credential",
            "create",
            "--application",
            "nosuch",
            "--namespace",
            "default",
            "--scope",
            "tasks:read",
            dsn=dsn,
        )
    )
    assert line.startswith("error: NOT_FOUND: application: 'nosuch' not found")
    line = one_line_error(
        await admin(
            "credential", "create", "--application", "shop", "--namespace", "other", "--scope", "tasks:read", dsn=dsn
        )
    )
    assert line.startswith("error: NOT_FOUND: namespace: 'other' not found")
    line = one_line_error(await admin("credential", "revoke", "f" * 32, dsn=dsn))
    assert line == f"error: NOT_FOUND: credential_id: credential {'f' * 32} not found"
    one_line_error(await admin("credential", "create", "--application", "shop", dsn=dsn), code=2)
    after = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM credentials"))
    assert after == before


async def test_a_credential_can_be_written_to_a_private_credentials_file(dsn, db, tmp_path):
    boot = await bootstrap(dsn, tmp_path)
    out = tmp_path / "worker.json"
    result = await admin(
        "credential",
        "create",
        "--application",
        "shop",
        "--namespace",
        "default",
        "--scope",
        "workers:connect",
        "--scope",
        "workers:consume=refunds",
        "--output",
        str(out),
        dsn=dsn,
        env={"ORBIT_URL": "http://orbit.example:8080"},
    )
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    document = json.loads(out.read_text())
    assert document["token"] not in result.stdout
    assert document["url"] == "http://orbit.example:8080"
    assert document["scopes"] == ["workers:connect", "workers:consume"]
    assert document["queues"] == {"orders": boot["queues"]["orders"], "refunds": boot["queues"]["refunds"]}
    principal = await TenancyStore(db).authenticate(document["token"])
    assert principal.allows("workers:consume", boot["queues"]["refunds"])
    assert not principal.allows("workers:consume", boot["queues"]["orders"])
    assert not principal.allows("tasks:read")


# -- applications ----------------------------------------------------------------------------


async def test_quota_suspend_and_resume_an_application(dsn, db):
    owner = await seed.tenant(db, application="shop")
    task_id = await seed.insert_task(db, owner)
    store = seed.lease_store(db)

    async def quota() -> tuple:
        row = await db.fetchone("app_by_name", {"name": "shop"})
        return row["max_concurrent_executions"], row["max_starts_per_second"]

    app = await admin_json("application", "quota", "shop", "--max-concurrent", "5", dsn=dsn)
    assert (app["max_concurrent_executions"], app["max_starts_per_second"]) == (5, None) == await quota()
    await admin_json("application", "quota", "shop", "--max-starts-per-second", "10", dsn=dsn)
    assert await quota() == (5, 10)  # the other field was kept
    text = await admin("application", "quota", "shop", "--max-concurrent", "none", dsn=dsn)
    assert text.returncode == 0 and "max_concurrent=unlimited max_starts_per_second=10" in text.stdout
    assert await quota() == (None, 10)
    one_line_error(await admin("application", "quota", "shop", dsn=dsn), code=2)
    one_line_error(await admin("application", "quota", "shop", "--max-concurrent", "-1", dsn=dsn), code=2)
    line = one_line_error(await admin("application", "quota", "nosuch", "--max-concurrent", "1", dsn=dsn))
    assert line == "error: NOT_FOUND: application: 'nosuch' not found"
    assert await quota() == (None, 10)

    suspended = await admin_json("application", "suspend", "shop", dsn=dsn)
    assert suspended["suspended"] is True
    assert await store.claim(seed.claim_request(owner)) == []
    explanation = await admin_json("explain", task_id, dsn=dsn)
    assert "APPLICATION_SUSPENDED" in [r["code"] for r in explanation["reasons"]]
    listed = await admin_json("application", "list", dsn=dsn)
    assert [(a["application"], a["suspended"], a["queued"]) for a in listed] == [("shop", True, 1)]
    resumed = await admin("application", "resume", "shop", dsn=dsn)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout
    assert [r.task_id for r in await store.claim(seed.claim_request(owner))] == [task_id]
    line = one_line_error(await admin("application", "suspend", "nosuch", dsn=dsn))
    assert line == "error: NOT_FOUND: application: 'nosuch' not found"


async def test_an_application_s_fairness_weight_is_set_listed_and_checked(dsn, db):
    await seed.tenant(db, application="shop")
    await seed.tenant(db, application="other")

    async def weights() -> dict[str, int]:
        rows = await db.run(lambda tx: tx.fetchall_raw("SELECT name, fairness_weight FROM applications"))
        return {r["name"]: r["fairness_weight"] for r in rows}

    listed = await admin_json("application", "list", dsn=dsn)
    assert {a["application"]: a["fairness_weight"] for a in listed} == {"shop": 1, "other": 1}
    app = await admin_json("application", "weight", "shop", "4", dsn=dsn)
    assert (app["application"], app["fairness_weight"]) == ("shop", 4)
    assert await weights() == {"shop": 4, "other": 1}
    text = await admin("application", "weight", "other", "100", dsn=dsn)
    assert text.returncode == 0 and text.stdout == "application other: fairness weight 100\n", text
    listed = await admin("application", "list", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    rows = [[cell.strip() for cell in line.split("│")] for line in listed.stdout.splitlines() if "│" in line]
    assert {row[1]: row[5] for row in rows} == {"other": "100", "shop": "4"}
    header = next(line for line in listed.stdout.splitlines() if "application" in line and "weight" in line)
    assert [cell.strip() for cell in header.split("┃")][5] == "weight"
    # Bad usage: one line naming the field, exit 2, nothing changed (even for an unknown application).
    for bad, shown in (("0", '"0"'), ("101", '"101"'), ("-1", '"-1"'), ("2.5", '"2.5"'), ("four", '"four"')):
        for application in ("shop", "nosuch"):
            line = one_line_error(await admin("application", "weight", application, bad, dsn=dsn), code=2)
            assert line == f"error: INVALID_ARGUMENT: weight: must be an integer from 1 to 100, got {shown}", line
    one_line_error(await admin("application", "weight", "shop", dsn=dsn), code=2)
    # An unknown application is a failed operation, as for quota and suspend.
    line = one_line_error(await admin("application", "weight", "nosuch", "2", dsn=dsn))
    assert line == "error: NOT_FOUND: application: 'nosuch' not found"
    assert await weights() == {"shop": 4, "other": 100}
    await admin_json("application", "weight", "shop", "1", dsn=dsn)
    assert await weights() == {"shop": 1, "other": 100}


async def test_an_application_s_worker_connection_limit_is_set_listed_and_checked(dsn, db):
    await seed.tenant(db, application="shop")
    await seed.tenant(db, application="other")

    async def limits() -> dict[str, int | None]:
        rows = await db.run(lambda tx: tx.fetchall_raw("SELECT name, max_worker_connections FROM applications"))
        return {r["name"]: r["max_worker_connections"] for r in rows}

    listed = await admin_json("application", "list", dsn=dsn)
    assert {a["application"]: a["max_worker_connections"] for a in listed} == {"shop": None, "other": None}
    app = await admin_json("application", "connections", "shop", "8", dsn=dsn)
    assert (app["application"], app["max_worker_connections"]) == ("shop", 8)
    text = await admin("application", "connections", "other", "0", dsn=dsn)
    assert text.returncode == 0 and text.stdout == "application other: Worker connections per node at most 0\n", text
    assert await limits() == {"shop": 8, "other": 0}
    listed = await admin("application", "list", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    header = next(line for line in listed.stdout.splitlines() if "application" in line and "weight" in line)
    column = [cell.strip() for cell in header.split("┃")].index("workers/node")
    rows = [[cell.strip() for cell in line.split("│")] for line in listed.stdout.splitlines() if "│" in line]
    assert {row[1]: row[column] for row in rows} == {"other": "0", "shop": "8"}
    # Bad usage: one line, exit 2, nothing changed; an unknown application is NOT_FOUND.
    for bad in ("-1", "2.5", "many", ""):
        line = one_line_error(await admin("application", "connections", "shop", bad, dsn=dsn), code=2)
        assert "N|none" in line and repr(bad) in line, line
    line = one_line_error(await admin("application", "connections", "nosuch", "2", dsn=dsn))
    assert line == "error: NOT_FOUND: application: 'nosuch' not found"
    assert await limits() == {"shop": 8, "other": 0}
    text = await admin("application", "connections", "shop", "none", dsn=dsn)
    assert text.stdout == "application shop: Worker connections per node its fair share of a full node\n", text
    assert await limits() == {"shop": None, "other": 0}


# -- queues, tasks, explanations -----------------------------------------------------------


async def test_queue_list_counts_backlog_by_state_and_by_priority(dsn, db):
    owner = await seed.tenant(db, application="shop", queue="work")
    idle = await seed.add_queue(db, owner, "idle")
    other = await seed.tenant(db, application="other", queue="elsewhere")
    store = seed.lease_store(db)
    await seed.insert_tasks(db, owner, [seed.TaskSpec(priority=p, available_in_s=-1) for p in (9, 9, 4, 0, 0)])
    await seed.insert_tasks(db, owner, [seed.TaskSpec(priority=2, available_in_s=3600)])
    done = await seed.insert_task(db, owner, priority=7)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id = %s", (done,)))
    await seed.insert_tasks(db, other, [seed.TaskSpec(priority=1)])
    first, second = await store.claim(seed.claim_request(owner, limit=2))  # the two of priority 9
    await store.start(first.task_id, first.fencing_token)

    queues = {q["queue"]: q for q in await admin_json("queue", "list", dsn=dsn)}
    assert set(queues) == {"work", "idle", "elsewhere"}
    work = queues["work"]
    assert (work["application"], work["namespace"], work["queue_id"]) == ("shop", "default", owner.queue_id)
    assert work["backlog"] == {"queued": 4, "due": 3, "scheduled": 1, "reserved": 1, "running": 1, "waiting": 0}
    assert work["queued_by_priority"] == {"4": 1, "2": 1, "0": 2}
    assert queues["idle"]["backlog"] == {
        "queued": 0,
        "due": 0,
        "scheduled": 0,
        "reserved": 0,
        "running": 0,
        "waiting": 0,
    }
    assert queues["idle"]["queue_id"] == idle.queue_id
    assert queues["elsewhere"]["queued_by_priority"] == {"1": 1}

    only = await admin_json("queue", "list", "--application", "other", dsn=dsn)
    assert [q["queue"] for q in only] == ["elsewhere"]
    text = await admin("queue", "list", "--application", "shop", "--namespace", "default", dsn=dsn)
    assert text.returncode == 0 and "p4:1 p2:1 p0:2" in text.stdout and "elsewhere" not in text.stdout
    one_line_error(await admin("queue", "list", "--namespace", "default", dsn=dsn), code=2)
    line = one_line_error(await admin("queue", "list", "--application", "nosuch", dsn=dsn))
    assert line == "error: NOT_FOUND: application: 'nosuch' not found"


async def test_queue_controls_change_only_the_options_given(dsn, db):
    owner = await seed.tenant(db, application="shop", queue="exports")
    shown = await admin_json("queue", "controls", "exports", "--application", "shop", dsn=dsn)
    assert shown == {
        "queue_id": owner.queue_id,
        "name": "exports",
        "changed": [],
        "max_concurrency": None,
        "max_starts_per_second": None,
        "max_running_per_key": 1,
    }
    changed = await admin_json("queue", "controls", owner.queue_id, "--max-running-per-key", "3", dsn=dsn)
    assert (changed["changed"], changed["max_running_per_key"]) == (["max_running_per_key"], 3)
    text = await admin(
        "queue", "controls", owner.queue_id, "--max-concurrency", "10", "--max-starts-per-second", "none", dsn=dsn
    )
    assert text.returncode == 0, text.stderr
    assert "max_concurrency=10 max_starts_per_second=unlimited max_running_per_key=3" in text.stdout
    for bad in ("0", "1001", "none", "2.5"):
        line = one_line_error(
            await admin("queue", "controls", owner.queue_id, "--max-running-per-key", bad, dsn=dsn), 2
        )
        assert "expected an integer from 1 to 1000" in line
    row = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM queues WHERE queue_id = %s", (owner.queue_id,)))
    assert (row[0]["max_concurrency"], row[0]["max_starts_per_second"], row[0]["max_running_per_key"]) == (10, None, 3)
    listed = {q["queue"]: q for q in await admin_json("queue", "list", dsn=dsn)}
    assert listed["exports"]["max_running_per_key"] == 3


async def test_task_show_lists_its_attempts_without_their_tokens(dsn, db):
    owner = await seed.tenant(db, application="shop")
    task_id = await seed.insert_task(db, owner, payload='{"n": 123456789012345678901234567890}')
    store = seed.lease_store(db)
    (first,) = await store.claim(seed.claim_request(owner))
    await store.start(task_id, first.fencing_token)
    await store.finish(task_id, first.fencing_token, error={"code": "BOOM", "message": "try later"}, retryable=True)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET available_at = NOW(6) WHERE task_id = %s", (task_id,)))
    (second,) = await store.claim(seed.claim_request(owner))

    result = await admin("task", "show", task_id, "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert first.fencing_token not in result.stdout and second.fencing_token not in result.stdout
    task = json.loads(result.stdout)
    assert "fencing_token" not in task
    assert (task["state"], task["attempts"], task["application"], task["queue"]) == ("reserved", 1, "shop", "q")
    assert task["payload"] == {"n": 123456789012345678901234567890}
    assert [(a["attempt"], a["outcome"]) for a in task["attempt_history"]] == [(1, "retry"), (2, None)]
    assert task["attempt_history"][0]["error"]["code"] == "BOOM"
    text = await admin("task", "show", task_id, dsn=dsn)
    assert text.returncode == 0 and "attempts (2)" in text.stdout and "(live)" in text.stdout and "retry" in text.stdout

    line = one_line_error(await admin("task", "show", "0" * 32, dsn=dsn))
    assert line == f"error: NOT_FOUND: task {'0' * 32} not found"
    line = one_line_error(await admin("task", "show", "xyz", dsn=dsn), 2)
    assert line == "error: TASK_ID: 'xyz' is not a task id (32 lowercase hex characters)"


async def test_explain_says_why_a_task_waits(dsn, db):
    owner = await seed.tenant(db, application="shop")
    task_id = await seed.insert_task(db, owner, priority=9)
    await TenancyStore(db).set_queue_paused(owner.namespace_id, owner.queue_id, True)
    explanation = await admin_json("explain", task_id, dsn=dsn)
    assert explanation["task_id"] == task_id and explanation["priority"] == 9
    assert not explanation["dispatchable"]
    assert {"QUEUE_PAUSED", "NO_CAPABLE_WORKER"} <= {r["code"] for r in explanation["reasons"]}
    text = await admin("explain", task_id, dsn=dsn)
    assert (
        text.returncode == 0
        and "waiting because:" in text.stdout
        and "QUEUE_PAUSED: queue 'q' is paused" in text.stdout
    )
    line = one_line_error(await admin("explain", "0" * 32, dsn=dsn))
    assert line == f"error: NOT_FOUND: task {'0' * 32} not found"


# -- top ---------------------------------------------------------------------------------------


async def test_top_shows_backlog_per_priority_running_and_claim_turns_of_every_node(node_config, db, dsn):
    # An hour-long scan cycle: empty results stay cached, so each connection's claims are
    # exact (P3's pace of 4 claims a second kept over the hour).
    config = attrs.evolve(
        node_config, scheduler=SchedulerLimits(scan_cycle_s=3600.0, claims_per_connection_per_cycle=4 * 3600)
    )
    alpha = await make_tenant(db, "alpha", queues=("work", "later"))
    beta = await make_tenant(db, "beta")
    alpha_work = seed.Tenant(alpha.application_id, alpha.namespace_id, alpha.queues["work"])
    alpha_later = seed.Tenant(alpha.application_id, alpha.namespace_id, alpha.queues["later"])
    await seed.insert_tasks(db, alpha_work, [seed.TaskSpec()] * 3)
    await seed.insert_tasks(db, alpha_later, [seed.TaskSpec(priority=p) for p in (9, 9, 4, 0)])
    await seed.insert_tasks(db, alpha_later, [seed.TaskSpec(priority=5, available_in_s=3600)])
    await seed.insert_tasks(db, beta, [seed.TaskSpec()] * 2)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            run_node(config, services=default_services()) as one,
            run_node(config, services=default_services()) as two,
        ):
            watch_one = ClaimWatch(one.node.state.services.pool)
            watch_two = ClaimWatch(two.node.state.services.pool)
            async with raw_worker(one.base_url, alpha.token) as w1:
                # Node one: alpha runs its 3 tasks (one claim: it took fewer than it asked
                # for, so the queue is remembered empty and the connection's next request,
                # with half a claim free, runs no SQL).
                await w1.hello([alpha.queues["work"]], capacity=6)
                tasks = (await w1.recv_type("dispatch"))["tasks"]
                ack = await w1.request("start", [{"task_id": t["task_id"], "token": t["token"]} for t in tasks], "s")
                assert len(ack["results"]) == 3 and all(r["ok"] for r in ack["results"])
                await watch_one.wait_for(1)
                async with raw_worker(two.base_url, beta.token) as w2, raw_worker(two.base_url, alpha.token) as w3:
                    # Node two: beta reserves its 2 tasks (1 claim); alpha finds nothing (1 claim).
                    await w2.hello([beta.queue_id], capacity=5)
                    assert len((await w2.recv_type("dispatch"))["tasks"]) == 2
                    await watch_two.wait_for(1)
                    await w3.hello([alpha.queues["work"]], capacity=1)
                    await watch_two.wait_for(2)
                    for running in (one, two):
                        await running.node.state.services.shards.main.turns.flush()

                    await admin_json("application", "weight", "beta", "3", dsn=dsn)
                    (frame,) = await top_frames("--once", dsn=dsn)
                    apps = {a["application"]: a for a in frame["applications"]}
                    assert (apps["alpha"]["claim_turns"], apps["beta"]["claim_turns"]) == (2, 1)
                    # Each share of the turns beside the share its weight gives (1 and 3 of 4).
                    assert [
                        (apps[a]["fairness_weight"], apps[a]["claim_turn_share"], apps[a]["weight_share"])
                        for a in ("alpha", "beta")
                    ] == [(1, 0.6667, 0.25), (3, 0.3333, 0.75)]
                    (beta_only,) = await top_frames("--once", "--application", "beta", dsn=dsn)
                    assert [(a["claim_turn_share"], a["weight_share"]) for a in beta_only["applications"]] == [
                        (0.3333, 0.75)
                    ]
                    assert apps["alpha"]["claim_turns_per_s"] is None  # one frame has no rate
                    assert (apps["alpha"]["running"], apps["alpha"]["reserved"], apps["alpha"]["queued"]) == (3, 0, 5)
                    assert (apps["beta"]["running"], apps["beta"]["reserved"]) == (0, 2)
                    queues = {(q["application"], q["queue"]): q for q in frame["queues"]}
                    later = queues[("alpha", "later")]
                    assert later["queued_by_priority"] == {"9": 2, "5": 1, "4": 1, "0": 1}
                    assert later["backlog"] == {
                        "queued": 5,
                        "due": 4,
                        "scheduled": 1,
                        "reserved": 0,
                        "running": 0,
                        "waiting": 0,
                    }
                    assert queues[("alpha", "work")]["backlog"]["running"] == 3
                    nodes = {n["node_id"]: n["connections"] for n in frame["nodes"]}
                    assert nodes == {one.node.node_id: 1, two.node.node_id: 2}
                    # Worker connections per application over the live nodes, and its limit per node.
                    assert [(apps[a]["worker_connections"], apps[a]["max_worker_connections"]) for a in apps] == [
                        (2, None),
                        (1, None),
                    ]

                    frames = await top_frames("--iterations", "2", "--interval", "0.2", dsn=dsn)
                    assert len(frames) == 2
                    assert {a["application"]: a["claim_turns_per_s"] for a in frames[1]["applications"]} == {
                        "alpha": 0.0,
                        "beta": 0.0,
                    }
                    text = await admin("top", "--once", dsn=dsn)
                    assert text.returncode == 0, text.stderr
                    for word in ("applications", "claim turns", "alpha", "beta", "later", "p9", "live nodes"):
                        assert word in text.stdout
                    beta_row = next(line for line in text.stdout.splitlines() if line.startswith("│ beta "))
                    assert [cell.strip() for cell in beta_row.split("│")][7:12] == ["3", "1", "-", "33.3 %", "75.0 %"]
                    assert [cell.strip() for cell in beta_row.split("│")][13:15] == ["1", "-"]
    # Stopped nodes took their counters with them.
    (frame,) = await top_frames("--once", dsn=dsn)
    assert frame["nodes"] == [] and {a["claim_turns"] for a in frame["applications"]} == {0}


async def top_frames(*args: str, dsn) -> list[dict]:
    result = await admin("top", *args, "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_refresh_loop_keeps_its_schedule_on_trios_clock(autojump_clock):
    from orbit_node.cli.top import refresh_loop

    started: list[float] = []
    work_s = [0.3, 0.3, 0.3]

    async def step():
        started.append(trio.current_time())
        await trio.sleep(work_s[len(started) - 1])

    t0 = trio.current_time()
    assert await refresh_loop(step, interval_s=1.0, iterations=3) == 3
    assert [round(t - t0, 6) for t in started] == [0.0, 1.0, 2.0]
    # A frame that overran its interval is followed at once, and no burst follows.
    started.clear()
    work_s[:] = [2.5, 0.1, 0.1]
    t0 = trio.current_time()
    await refresh_loop(step, interval_s=1.0, iterations=3)
    assert [round(t - t0, 6) for t in started] == [0.0, 2.5, 3.5]


# -- every command: --help, and one line when the database is down ---------------------------

COMMANDS = [
    ["bootstrap", "--application", "a", "--namespace", "n", "--environment", "e", "--queue", "q", "--output", "OUT"],
    ["credential", "create", "--application", "a", "--namespace", "n", "--scope", "tasks:read"],
    ["credential", "revoke", "f" * 32],
    ["credential", "list", "--application", "a"],
    ["application", "list"],
    ["application", "quota", "a", "--max-concurrent", "1"],
    ["application", "weight", "a", "2"],
    ["application", "suspend", "a"],
    ["application", "resume", "a"],
    ["queue", "list"],
    ["task", "show", "f" * 32],
    ["task", "cancel", "f" * 32],
    ["task", "retry", "f" * 32],
    ["task", "list", "--application", "a"],
    ["queue", "pause", "f" * 32],
    ["queue", "resume", "f" * 32],
    ["queue", "controls", "f" * 32, "--max-running-per-key", "3"],
    ["explain", "f" * 32],
    ["top", "--once"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
async def test_every_command_fails_in_one_line_when_the_database_is_down(command, tmp_path):
    command = [str(tmp_path / "out.json") if part == "OUT" else part for part in command]
    result = await admin(*command, env={"ORBIT_MYSQL_DSN": DOWN_DSN})
    line = one_line_error(result)
    assert line.startswith("error: UNAVAILABLE: database unavailable"), line
    assert result.stdout == ""


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_every_command_has_help_and_json(command):
    path = [part for part in command[:2] if not part.startswith("-")]
    if path[0] in ("bootstrap", "explain", "top"):
        path = path[:1]
    result = cli("orbit-admin", *path, "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: orbit-admin " + " ".join(path))
    assert "--json" in result.stdout


def test_without_a_database_setting_or_with_bad_usage_it_is_one_line():
    line = one_line_error(cli("orbit-admin", "queue", "list"))
    assert line == "error: ORBIT_MYSQL_DSN is not set"
    line = one_line_error(cli("orbit-admin", "frobnicate", env={"ORBIT_MYSQL_DSN": DOWN_DSN}), code=2)
    assert "invalid choice: 'frobnicate'" in line
