"""Retention: which finished tasks expire, and the pruner that deletes them with what
belongs to them (rules as pure functions; the rest on a real MariaDB with rows written
at chosen finish times)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from orbit_node.dispatch.pruner import Pruner
from orbit_node.domain.errors import InvalidArgument
from orbit_node.domain.retention import (
    CLASS_OF_STATE,
    MAX_RETENTION_S,
    STATES_OF_CLASS,
    UNITS,
    Retention,
    RetentionClass,
    class_of,
    format_duration,
    is_expired,
    parse_duration,
)
from orbit_node.services import default_services
from orbit_node.store.operations import OperationsStore
from orbit_node.store.pruning import PruneStats, PruneStore
from orbit_sdk.client import OrbitClient
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from ..helpers import cli, wait_until
from ..nodeutil import count_rows, make_tenant, run_node
from ..seed import TaskSpec, Tenant, insert_tasks, tenant

STATES = ("queued", "reserved", "running", "succeeded", "failed", "cancelled", "expired")
LIVE = ("queued", "reserved", "running")
NOW = datetime(2026, 6, 1, 12, 0, 0)


# -- the rules ------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=MAX_RETENTION_S))
def test_a_formatted_duration_reads_back_as_the_same_seconds(seconds):
    assert parse_duration(format_duration(seconds), "d") == seconds


@given(st.integers(min_value=1, max_value=20_000), st.sampled_from(sorted(UNITS)))
def test_a_duration_with_a_unit_is_that_many_units(count, unit):
    assert parse_duration(f"{count}{unit}", "d") == count * UNITS[unit]
    assert parse_duration(f" {count}{unit.upper()} ", "d") == count * UNITS[unit]


@pytest.mark.parametrize("text", ["0", "0s", "-5", "1.5h", "h", "", "5w", "1d2h", "ten", "9" * 12])
def test_a_bad_duration_is_refused_naming_the_field(text):
    with pytest.raises(InvalidArgument) as refused:
        parse_duration(text, "--succeeded")
    assert refused.value.field == "--succeeded"
    assert refused.value.code == "INVALID_ARGUMENT"


def test_plain_seconds_and_each_unit():
    assert [parse_duration(t, "d") for t in ("90s", "15m", "12h", "7d", "3600", 45)] == [
        90,
        900,
        43200,
        604800,
        3600,
        45,
    ]
    assert [format_duration(s) for s in (90, 900, 5400, 86400, 90000, 1)] == ["90s", "15m", "90m", "1d", "25h", "1s"]


def test_every_terminal_state_has_a_class_and_no_live_state_has_one():
    assert {s for s in STATES if class_of(s) is not None} == set(CLASS_OF_STATE)
    assert class_of("succeeded") is RetentionClass.SUCCEEDED
    assert {class_of(s) for s in ("failed", "cancelled", "expired")} == {RetentionClass.FAILED}
    assert all(class_of(s) is None for s in LIVE)


@given(
    st.sampled_from(STATES),
    st.integers(min_value=-(10**8), max_value=10**8),
    st.integers(min_value=1, max_value=10**7),
    st.integers(min_value=1, max_value=10**7),
)
def test_only_a_terminal_task_older_than_its_class_retention_expires(state, finished_ago_s, succeeded_s, failed_s):
    retention = Retention(succeeded_s, failed_s)
    finished_at = NOW - timedelta(seconds=finished_ago_s)
    expired = is_expired(state, finished_at, NOW, retention)
    if state in LIVE:
        assert not expired
    else:
        keep = succeeded_s if state == "succeeded" else failed_s
        assert expired == (finished_ago_s > keep)
    assert not is_expired(state, None, NOW, retention)


def test_an_application_s_own_retention_overrides_the_default_per_class():
    defaults = Retention(100, 200)
    assert defaults.applied_to({"retain_succeeded_s": None, "retain_failed_s": None}) == defaults
    assert defaults.applied_to({"retain_succeeded_s": 5, "retain_failed_s": None}) == Retention(5, 200)
    assert defaults.applied_to({"retain_succeeded_s": None, "retain_failed_s": 7}) == Retention(100, 7)


# -- rows at chosen finish times ----------------------------------------------------


async def finished(db, owner: Tenant, state: str, ago_s: float, *, count: int = 1, key: str | None = None) -> list[str]:
    """``count`` tasks in ``state`` that finished ``ago_s`` seconds ago on the database clock
    (live states keep that finish time too: a row no rule lets the pruner touch), each
    with two attempts and an acceptance record."""
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-ago_s - 10) for _ in range(count)])

    async def body(tx):
        await tx.execute_raw(
            "UPDATE tasks SET state = %s, finished_at = NOW(6) - INTERVAL %s MICROSECOND, "
            "created_at = NOW(6) - INTERVAL 400 DAY WHERE task_id IN %s",
            (state, int(ago_s * 1_000_000), tuple(ids)),
        )
        for n, task_id in enumerate(ids):
            for attempt in (1, 2):
                await tx.execute_raw(
                    "INSERT INTO task_attempts (task_id, attempt, fencing_token, reserved_at, finished_at, outcome) "
                    "VALUES (%s, %s, %s, NOW(6), NOW(6), 'failed')",
                    (task_id, attempt, f"{attempt}-tok"),
                )
            await tx.execute_raw(
                "INSERT INTO idempotency_records (namespace_id, kind, idempotency_key, request_digest, task_id) "
                "VALUES (%s, 'request', %s, %s, %s)",
                (owner.namespace_id, key if key is not None else f"key-{task_id}-{n}", "0" * 64, task_id),
            )

    await db.transaction(body)
    return ids


async def present(db, ids) -> set[str]:
    if not ids:
        return set()
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT task_id FROM tasks WHERE task_id IN %s", (tuple(ids),)))
    return {r["task_id"] for r in rows}


async def belongings(db, ids) -> tuple[int, int]:
    """Attempt rows and acceptance records of ``ids`` still in the database."""

    async def body(tx):
        attempts = await tx.fetchall_raw("SELECT COUNT(*) AS n FROM task_attempts WHERE task_id IN %s", (tuple(ids),))
        records = await tx.fetchall_raw(
            "SELECT COUNT(*) AS n FROM idempotency_records WHERE task_id IN %s", (tuple(ids),)
        )
        return int(attempts[0]["n"]), int(records[0]["n"])

    return await db.run(body)


def pruner(db, defaults: Retention | None = None, **kwargs) -> Pruner:
    kwargs.setdefault("rate", 1_000_000)
    kwargs.setdefault("audit_s", 365 * 86400)
    return Pruner(PruneStore(db), 1.0, defaults=defaults or Retention(), **kwargs)


async def set_retention(db, application: str, **changes) -> None:
    await OperationsStore(db).patch_retention(application, changes)


async def test_only_terminal_tasks_older_than_their_application_s_retention_go_with_what_belongs_to_them(db):
    a = await tenant(db, application="a")
    b = await tenant(db, application="b")
    await set_retention(db, "a", succeeded="60s", failed="1h")
    go = [
        *await finished(db, a, "succeeded", 61, count=3),
        *await finished(db, a, "failed", 3601),
        *await finished(db, a, "cancelled", 3601),
        *await finished(db, a, "expired", 3700),
        *await finished(db, b, "succeeded", 130),
    ]
    stay = [
        *await finished(db, a, "succeeded", 50),
        *await finished(db, a, "failed", 61),
        *await finished(db, a, "cancelled", 3500),
        *await finished(db, b, "succeeded", 100),
        *await finished(db, b, "failed", 150),
        # Live tasks, however old (and even with a finish time written by hand).
        *[task for state in LIVE for task in await finished(db, a, state, 10**7)],
    ]
    service = pruner(db, Retention(120, 3600 * 24))
    stats = await service.run_round()
    assert await present(db, go + stay) == set(stay)
    assert await belongings(db, go) == (0, 0)
    assert await belongings(db, stay) == (2 * len(stay), len(stay))
    assert (stats.tasks, stats.attempts, stats.records, stats.audit) == (len(go), 2 * len(go), len(go), 0)
    assert service.totals == attrs_total(stats)
    assert service.lag_s == 0.0
    # Nothing else has expired: the next round deletes nothing.
    assert await service.run_round() == PruneStats()


def attrs_total(stats: PruneStats) -> PruneStats:
    return PruneStats(stats.tasks, stats.attempts, stats.records, stats.audit)


async def test_a_changed_retention_applies_to_tasks_that_finished_before_the_change(db):
    owner = await tenant(db, application="a")
    ids = await finished(db, owner, "succeeded", 600, count=2)
    service = pruner(db)
    await service.run_round()
    assert await present(db, ids) == set(ids)
    await set_retention(db, "a", succeeded="5m")
    await service.run_round()
    assert await present(db, ids) == set()
    await set_retention(db, "a", succeeded=None)
    assert (await OperationsStore(db).application("a"))["retain_succeeded_s"] is None


async def test_a_big_backlog_goes_in_batches_oldest_first_and_the_lag_says_how_far_behind(db):
    owner = await tenant(db, application="a")
    await set_retention(db, "a", succeeded="60s")
    old = await finished(db, owner, "succeeded", 5000, count=30)
    newer = await finished(db, owner, "succeeded", 1000, count=30)
    service = pruner(db, batch=25)
    batch = await service._tasks((await service.store.applications(service.defaults))[0], RetentionClass.SUCCEEDED)
    assert batch.stats.tasks == 25 and batch.stats.saturated
    # The oldest go first, and what is left is reported as the lag (seconds past retention).
    assert len(await present(db, old)) == 5 and await present(db, newer) == set(newer)
    assert 4900 < service.lag_s < 5000
    stats = await service.run_round()
    assert stats.tasks == 35
    assert await present(db, old + newer) == set()
    assert service.lag_s == 0.0


async def test_a_batch_reads_the_index_entries_of_what_it_deletes_and_no_others(db):
    """The candidates are index ranges that begin with the expired tasks: live tasks,
    tasks not yet expired and other applications' tasks, hundreds of each, are not read."""
    owner = await tenant(db, application="a")
    other = await tenant(db, application="b")
    await set_retention(db, "a", succeeded="60s", failed="60s")
    await set_retention(db, "b", succeeded="60s", failed="60s")
    expired = [
        *await finished(db, owner, "succeeded", 500, count=20),
        *await finished(db, owner, "failed", 500, count=5),
    ]
    for state in ("succeeded", "failed", "cancelled"):
        await finished(db, owner, state, 30, count=150)
        await finished(db, other, state, 500, count=150)
    for state in LIVE:
        await finished(db, owner, state, 10**6, count=150)
    store = PruneStore(db)

    async def reads(cls: RetentionClass) -> tuple[int, list[str]]:
        async def body(tx):
            before = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Handler_read%%'")
            found = await tx.fetchall_union(
                "prune_candidates_branch",
                "prune_candidates_order",
                [{"state": s} for s in STATES_OF_CLASS[cls]],
                {"application_id": owner.application_id, "keep_s": 60, "limit": 200},
            )
            after = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Handler_read%%'")
            counts = {r["Variable_name"]: int(r["Value"]) for r in before}
            # The two SHOW statements read their own rows (one per Handler_read_ variable).
            read = sum(int(r["Value"]) - counts[r["Variable_name"]] for r in after) - 2 * len(before)
            return read, [r["task_id"] for r in found]

        return await store.db.run(body)

    read, found = await reads(RetentionClass.SUCCEEDED)
    assert sorted(found) == sorted(expired[:20])
    # One index dive and one step per entry read, per state; the union's own rows.
    assert read <= 2 * (20 + 1) + 20 + 2, read
    read, found = await reads(RetentionClass.FAILED)
    assert sorted(found) == sorted(expired[20:])
    assert read <= 2 * (5 + 3) + 5 + 2, read


async def test_the_pruner_keeps_its_pace(db):
    owner = await tenant(db, application="a")
    await set_retention(db, "a", succeeded="1s")
    await finished(db, owner, "succeeded", 100, count=300)
    service = pruner(db, batch=50, rate=500)
    started = trio.current_time()
    stats = await service.run_round()
    # Six batches of 50 at 500 tasks/s: each batch is followed by a pause up to 0.1 s.
    assert stats.tasks == 300
    assert trio.current_time() - started >= 0.55


async def test_a_pruner_asked_to_stop_starts_no_batch(db):
    owner = await tenant(db, application="a")
    await set_retention(db, "a", succeeded="1s")
    ids = await finished(db, owner, "succeeded", 100, count=5)
    stopping = trio.Event()
    stopping.set()
    service = pruner(db, stopping=stopping)
    assert await service.run_round() == PruneStats()
    assert await present(db, ids) == set(ids)


async def test_two_pruners_side_by_side_delete_each_task_once_and_never_wait_for_each_other(db, dsn):
    from orbit_node.db import Database

    owners = [await tenant(db, application=f"app{n}") for n in range(3)]
    ids = []
    for owner in owners:
        await set_retention(db, owner_name(owner, owners), succeeded="1s", failed="1s")
        ids += await finished(db, owner, "succeeded", 50, count=200)
        ids += await finished(db, owner, "failed", 50, count=100)
    other = Database(dsn, size=4)
    try:
        first, second = pruner(db, batch=20), pruner(other, batch=20)
        results: list[PruneStats] = []

        async def run(service):
            results.append(await service.run_round())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, first)
            nursery.start_soon(run, second)
    finally:
        with trio.CancelScope(shield=True):
            await other.aclose()
    assert sum(r.tasks for r in results) == len(ids) == 900
    assert sum(r.attempts for r in results) == 2 * len(ids)
    assert sum(r.records for r in results) == len(ids)
    assert all(r.tasks > 0 for r in results), "both pruners took part"
    assert db.replays == other.replays == 0, "no deadlock and no lock wait"
    assert await count_rows(db, "tasks") == 0


def owner_name(owner: Tenant, owners: list[Tenant]) -> str:
    return f"app{owners.index(owner)}"


async def test_audit_records_go_after_their_own_retention(db):
    owner = await tenant(db, application="a")

    async def body(tx):
        for days in (400, 366, 364, 1):
            await tx.execute_raw(
                "INSERT INTO audit_records (recorded_at, application_id, namespace_id, credential_id, via, action, "
                "changed, outcome) VALUES (NOW(6) - INTERVAL %s DAY, %s, %s, %s, 'console', 'task.cancel', 1, 'ok')",
                (days, owner.application_id, owner.namespace_id, "0" * 32),
            )

    await db.transaction(body)
    stats = await pruner(db, audit_s=365 * 86400).run_round()
    assert stats.audit == 2
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT DATEDIFF(NOW(6), recorded_at) AS days FROM audit_records ORDER BY 1")
    )
    assert [r["days"] for r in rows] == [1, 364]


async def test_a_plan_does_not_fire_a_time_again_once_its_task_and_fire_record_are_gone(db):
    from orbit_node.store.plans import PlanStore

    from ..plans_seed import create_plan, definition, seconds, set_next_fire, whole_second

    owner = await tenant(db, application="a")
    plans = PlanStore(db)
    t0 = await whole_second(db) - seconds(120)
    plan = await create_plan(db, owner, definition(interval_s=3600, start_at=t0, grace_s=86400))
    await set_next_fire(db, plan.plan_id, t0)
    fired = await plans.fire(plan.plan_id, limit=10)
    assert fired.created == 1
    fired_at = (await db.run(lambda tx: tx.fetchall_raw("SELECT last_fire_at FROM plans")))[0]["last_fire_at"]
    task_ids = [r["task_id"] for r in await db.run(lambda tx: tx.fetchall_raw("SELECT task_id FROM tasks"))]
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = 'succeeded', finished_at = NOW(6) - INTERVAL 2 DAY WHERE task_id IN %s",
            (tuple(task_ids),),
        )
    )
    assert (await pruner(db).run_round()).records == 1
    # Rewind the plan to the fire time whose record is gone: nothing is created again.
    await db.run(
        lambda tx: tx.execute_raw("UPDATE plans SET next_fire_at = %s WHERE plan_id = %s", (fired_at, plan.plan_id))
    )
    again = await plans.fire(plan.plan_id, limit=10)
    assert again.created == 0
    assert await count_rows(db, "tasks") == 0


# -- through the API and a Worker --------------------------------------------------------


def submit_request(queue_id: str, **extra) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler="h", handler_version="v1", payload_version="v1", payload={"n": 1}, **extra
    )


async def test_an_idempotency_key_finds_its_task_while_it_is_kept_and_may_be_used_again_once_it_is_gone(
    running_node, db
):
    owner = await make_tenant(db, "a")
    queue_id = owner.queues["q1"]
    async with OrbitClient(running_node.base_url, owner.token) as client:
        first = await client.submit_task("k-1", submit_request(queue_id))
        assert first.created
        task_id = first.task.task_id
        await db.run(
            lambda tx: tx.execute_raw(
                "UPDATE tasks SET state = 'succeeded', finished_at = NOW(6) - INTERVAL 2 DAY WHERE task_id = %s",
                (task_id,),
            )
        )
        again = await client.submit_task("k-1", submit_request(queue_id))
        assert (again.created, again.task.task_id) == (False, task_id)
        assert (await pruner(db).run_round()).tasks == 1
        async with httpx.AsyncClient(base_url=running_node.base_url) as http:
            gone = await http.get(f"/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {owner.token}"})
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "NOT_FOUND"
        reused = await client.submit_task("k-1", submit_request(queue_id))
        assert reused.created and reused.task.task_id != task_id


async def test_a_short_retention_set_with_orbit_admin_empties_every_table_of_tasks_an_sdk_worker_ran(
    node_config, db, dsn
):
    import attrs

    owner = await make_tenant(db, "short")
    queue_id = owner.queues["q1"]
    done = cli("orbit-admin", "application", "retention", "short", "--succeeded", "1s", "--failed", "2s", dsn=dsn)
    assert done.returncode == 0, done.stderr
    config = attrs.evolve(node_config, prune_interval_s=1.0)
    async with run_node(config, services=default_services()) as node:
        async with OrbitClient(node.base_url, owner.token) as client:
            ids = []
            for n in range(6):
                request = submit_request(queue_id, max_attempts=1)
                ids.append((await client.submit_task(f"key-{n}", request)).task.task_id)
            worker = Worker(url=node.base_url, token=owner.token, queues=[queue_id], capacity=4)
            ran = []

            @worker.handler("h", "v1", "v1")
            async def handle(task: WorkerTask):
                ran.append(task.task_id)
                if len(ran) % 2:
                    raise RuntimeError("this one fails")
                return {"ok": True}

            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run)
                await wait_until(lambda: len(ran) == 6, timeout_s=30)
                await worker.drain()

            async def all_gone() -> bool:
                counts = [await count_rows(db, t) for t in ("tasks", "task_attempts", "idempotency_records")]
                return counts == [0, 0, 0]

            await wait_until(all_gone, timeout_s=30)
            async with httpx.AsyncClient(base_url=node.base_url) as http:
                for task_id in ids:
                    answer = await http.get(f"/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {owner.token}"})
                    assert answer.status_code == 404
    shown = cli("orbit-admin", "application", "list", "--json", dsn=dsn)
    (app,) = [a for a in json.loads(shown.stdout) if a["application"] == "short"]
    assert app["retention"]["succeeded"] == {"seconds": 1, "duration": "1s", "default": False}
    assert app["retention"]["failed"] == {"seconds": 2, "duration": "2s", "default": False}


async def test_orbit_admin_shows_what_retention_deletes_next_and_refuses_bad_durations(db, dsn):
    owner = await tenant(db, application="a")
    await finished(db, owner, "succeeded", 7200, count=3)
    await finished(db, owner, "succeeded", 600, count=1)
    await finished(db, owner, "cancelled", 30, count=2)
    shown = cli("orbit-admin", "application", "retention", "a", "--succeeded", "1h", "--json", dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["changed"] == ["succeeded"]
    succeeded, failed = data["due"]
    assert (succeeded["class"], succeeded["expired"]) == ("succeeded", 3)
    assert succeeded["next_expiry_at"] is not None
    assert (failed["class"], failed["expired"], failed["states"]) == ("failed", 0, ["failed", "cancelled", "expired"])
    assert data["retention"]["failed"] == {"seconds": 7 * 86400, "duration": "7d", "default": True}
    # The node default, as this environment sets it.
    env_default = cli(
        "orbit-admin", "application", "retention", "a", "--json", dsn=dsn, env={"ORBIT_RETAIN_FAILED": "20s"}
    )
    assert json.loads(env_default.stdout)["due"][1]["expired"] == 2
    text = cli("orbit-admin", "application", "retention", "a", dsn=dsn)
    assert "what the pruner deletes next" in text.stdout and "7d (node default)" in text.stdout
    for bad in ("0", "5w", "-1s"):
        refused = cli("orbit-admin", "application", "retention", "a", f"--failed={bad}", dsn=dsn)
        assert refused.returncode == 2
        assert "--failed" in refused.stderr and "duration" in refused.stderr
    missing = cli("orbit-admin", "application", "retention", "nope", "--failed", "1d", dsn=dsn)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


async def test_a_retry_names_a_task_that_is_gone_once_the_original_is_pruned(running_node, db):
    owner = await make_tenant(db, "a")
    queue_id = owner.queues["q1"]
    headers = {"Authorization": f"Bearer {owner.token}"}
    async with OrbitClient(running_node.base_url, owner.token) as client:
        original = (await client.submit_task("k", submit_request(queue_id))).task.task_id
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = 'failed', finished_at = NOW(6) - INTERVAL 8 DAY WHERE task_id = %s", (original,)
        )
    )
    async with httpx.AsyncClient(base_url=running_node.base_url, headers=headers) as http:
        retried = await http.post(f"/v1/tasks/{original}/retry")
        assert retried.status_code == 201
        retry_id = retried.json()["data"]["task_id"]
        assert (await pruner(db).run_round()).tasks == 1
        kept = await http.get(f"/v1/tasks/{retry_id}")
        assert kept.json()["data"]["retried_from"] == original
        assert (await http.get(f"/v1/tasks/{original}")).status_code == 404
