"""The plan trigger against a real MariaDB: priorities inherited from immutable versions,
exactly one task per fire time across concurrent nodes, catch-up after an outage, and the
database clock deciding what is due. Fire times are put in the past by writing rows."""

from __future__ import annotations

import json
import logging

import trio

from orbit_node.db import Database
from orbit_node.dispatch.plan_trigger import PlanTrigger
from orbit_node.domain.plans.definition import parse_definition
from orbit_node.node import Node
from orbit_node.services import ServiceSet
from orbit_node.store.plans import PlanStore, fire_key

from ..plans_seed import (
    create_plan,
    db_now,
    definition,
    fire_records,
    plan_row,
    plan_tasks,
    seconds,
    set_next_fire,
    whole_second,
)
from ..seed import tenant

# A bound on any one test's database work (the database is local).
TEST_TIMEOUT_S = 60


async def test_a_priority_7_version_creates_priority_7_tasks_ordered_210_s_ahead(db):
    owner = await tenant(db)
    t0 = await whole_second(db) - seconds(600)
    # Eleven fire times, one a minute, all in the past and within the grace window.
    plan = await create_plan(
        db, owner, definition(priority=7, interval_s=60, start_at=t0, end_at=t0 + seconds(600), grace_s=3600)
    )
    await set_next_fire(db, plan.plan_id, t0)
    with trio.fail_after(TEST_TIMEOUT_S):
        result = await PlanStore(db).fire(plan.plan_id, limit=100)
    assert (result.locked, result.created, result.still_due) == (True, 11, False)
    rows = await plan_tasks(db, plan.plan_id)
    assert [r["available_at"] for r in rows] == [t0 + seconds(60 * k) for k in range(11)]
    for row in rows:
        assert row["priority"] == 7
        assert row["dispatch_at"] == row["available_at"] - seconds(210)
        assert (row["plan_version"], row["queue_id"], row["application_id"]) == (
            1,
            owner.queue_id,
            owner.application_id,
        )
        assert json.loads(row["payload"]) == {"n": 10**30}
    # The end was reached: nothing is due any more.
    assert (await plan_row(db, plan.plan_id))["next_fire_at"] is None
    assert (await plan_row(db, plan.plan_id))["last_fire_at"] == t0 + seconds(600)


async def test_editing_is_a_new_version_and_created_tasks_keep_the_old_priority(db):
    owner = await tenant(db)
    store = PlanStore(db)
    t0 = await whole_second(db) - seconds(3000)
    v1 = definition(priority=7, interval_s=60, start_at=t0, grace_s=86400)
    plan = await create_plan(db, owner, v1)
    await set_next_fire(db, plan.plan_id, t0)
    with trio.fail_after(TEST_TIMEOUT_S):
        await store.fire(plan.plan_id, limit=5)
        old = await plan_tasks(db, plan.plan_id)
        stored_v1 = (await store.get_version(owner.namespace_id, plan.plan_id, 1)).definition_json

        # The edit: a new version with another priority and another grid.
        t1 = t0 + seconds(30)
        v2 = definition(priority=2, interval_s=60, start_at=t1, grace_s=86400)
        added = await store.add_version(owner.namespace_id, plan.plan_id, parse_definition(v2))
        assert added.version == 2
        # Adding a version changes nothing until it is activated.
        assert (await plan_row(db, plan.plan_id))["active_version"] == 1
        activated = await store.activate(owner.namespace_id, plan.plan_id, 2)
        now = await db_now(db)
        assert activated.active_version == 2
        # Activation recomputed next_fire_at on the new version's grid, at or after NOW(6).
        assert activated.next_fire_at >= now - seconds(1)
        assert (activated.next_fire_at - t1).total_seconds() % 60 == 0
        await set_next_fire(db, plan.plan_id, t1 + seconds(600))
        await store.fire(plan.plan_id, limit=3)

    rows = await plan_tasks(db, plan.plan_id)
    by_version = {v: [r for r in rows if r["plan_version"] == v] for v in (1, 2)}
    assert len(by_version[1]) == 5 and len(by_version[2]) == 3
    # The tasks version 1 created are untouched: priority 7, ordered 210 s ahead.
    assert by_version[1] == old
    assert {r["priority"] for r in by_version[1]} == {7}
    for row in by_version[2]:
        assert row["priority"] == 2
        assert row["dispatch_at"] == row["available_at"] - seconds(60)
    assert [r["available_at"] for r in by_version[2]] == [t1 + seconds(600 + 60 * k) for k in range(3)]
    # Version 1 itself is immutable: its stored definition is what was sent.
    assert (await store.get_version(owner.namespace_id, plan.plan_id, 1)).definition_json == stored_v1
    assert json.loads(stored_v1) == v1


async def test_three_nodes_triggering_one_plan_concurrently_create_exactly_50_tasks(dsn):
    nodes = [Database(dsn, size=4) for _ in range(3)]
    try:
        owner = await tenant(nodes[0])
        t0 = await whole_second(nodes[0]) - seconds(120)
        # 50 fire times, one a second, every one of them already in the past.
        plan = await create_plan(
            nodes[0], owner, definition(priority=3, interval_s=1, start_at=t0, end_at=t0 + seconds(49), grace_s=3600)
        )
        await set_next_fire(nodes[0], plan.plan_id, t0)
        # Small batches, so the 50 fire times take several transactions and the three
        # nodes really interleave; several trigger loops per node, each on its own connection.
        triggers = [PlanTrigger(PlanStore(db), interval_s=1, fires_per_transaction=3) for db in nodes for _ in range(3)]
        start = trio.Event()
        passes = []

        async def run(trigger):
            await start.wait()
            while True:
                stats = await trigger.trigger_once()
                passes.append(stats)
                if not stats.plans_fired and not stats.plans_skipped:
                    break  # nothing is due any more

        with trio.fail_after(TEST_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for trigger in triggers:
                    nursery.start_soon(run, trigger)
                start.set()
        rows = await plan_tasks(nodes[0], plan.plan_id)
        records = await fire_records(nodes[0], owner.namespace_id)
        final = await plan_row(nodes[0], plan.plan_id)
    finally:
        for db in nodes:
            with trio.CancelScope(shield=True):
                await db.aclose()
    fire_times = [t0 + seconds(k) for k in range(50)]
    assert len(rows) == 50
    assert [r["available_at"] for r in rows] == fire_times
    assert {r["priority"] for r in rows} == {3}
    # One fire record per task, keyed by plan, version and fire time.
    assert sorted(records, key=lambda r: r["idempotency_key"]) == sorted(
        (
            {"idempotency_key": fire_key(plan.plan_id, 1, f), "task_id": r["task_id"]}
            for f, r in zip(fire_times, rows, strict=True)
        ),
        key=lambda r: r["idempotency_key"],
    )
    assert sum(s.tasks_created for s in passes) == 50
    assert (final["next_fire_at"], final["last_fire_at"]) == (None, fire_times[-1])


async def test_a_fire_time_never_creates_a_second_task_even_when_next_fire_at_is_rewound(db):
    owner = await tenant(db)
    store = PlanStore(db)
    t0 = await whole_second(db) - seconds(100)
    plan = await create_plan(db, owner, definition(interval_s=10, start_at=t0, end_at=t0 + seconds(50), grace_s=3600))
    await set_next_fire(db, plan.plan_id, t0)
    with trio.fail_after(TEST_TIMEOUT_S):
        first = await store.fire(plan.plan_id, limit=100)
        # Something (an operator, a restore) puts next_fire_at back: the fire records hold.
        await set_next_fire(db, plan.plan_id, t0)
        again = await store.fire(plan.plan_id, limit=100)
    assert (first.created, first.duplicates) == (6, 0)
    assert (again.created, again.duplicates) == (0, 6)
    assert len(await plan_tasks(db, plan.plan_id)) == 6


async def test_catch_up_skip_creates_nothing_for_missed_fire_times_only_the_next_future_one(db):
    owner = await tenant(db)
    store = PlanStore(db)
    now = await whole_second(db)
    # Hourly; the latest fire time was 30 minutes ago, the next is in 30 minutes.
    anchor = now - seconds(10 * 3600 + 1800)
    plan = await create_plan(db, owner, definition(interval_s=3600, start_at=anchor, catch_up="skip"))
    assert plan.next_fire_at == now + seconds(1800)
    # The outage: no node ran for ten hours.
    await set_next_fire(db, plan.plan_id, anchor)
    with trio.fail_after(TEST_TIMEOUT_S):
        result = await store.fire(plan.plan_id, limit=100)
    assert (result.created, result.skipped_missed) == (0, True)
    assert await plan_tasks(db, plan.plan_id) == []
    assert (await plan_row(db, plan.plan_id))["next_fire_at"] == now + seconds(1800)


async def test_catch_up_fire_once_creates_one_task_carrying_the_latest_missed_fire_time(db):
    owner = await tenant(db)
    store = PlanStore(db)
    now = await whole_second(db)
    anchor = now - seconds(10 * 3600 + 1800)
    plan = await create_plan(db, owner, definition(priority=5, interval_s=3600, start_at=anchor, catch_up="fire_once"))
    await set_next_fire(db, plan.plan_id, anchor)
    with trio.fail_after(TEST_TIMEOUT_S):
        result = await store.fire(plan.plan_id, limit=100)
        # Later passes find nothing more to do for the outage.
        later = await store.fire(plan.plan_id, limit=100)
    assert (result.created, result.skipped_missed) == (1, True)
    assert later.locked is False
    (row,) = await plan_tasks(db, plan.plan_id)
    latest_missed = now - seconds(1800)
    assert row["available_at"] == latest_missed
    assert row["dispatch_at"] == latest_missed - seconds(150)
    after = await plan_row(db, plan.plan_id)
    assert (after["next_fire_at"], after["last_fire_at"]) == (now + seconds(1800), latest_missed)


async def test_catch_up_after_an_outage_of_a_cron_plan_in_a_time_zone(db):
    owner = await tenant(db)
    store = PlanStore(db)
    plan = await create_plan(
        db, owner, definition(cron="*/5 * * * *", time_zone="Asia/Kolkata", catch_up="fire_once", grace_s=1)
    )
    day_ago = await db_now(db) - seconds(86400)
    await set_next_fire(db, plan.plan_id, day_ago.replace(second=0, microsecond=0))
    with trio.fail_after(TEST_TIMEOUT_S):
        before = await db_now(db)
        result = await store.fire(plan.plan_id, limit=100)
        after = await db_now(db)
    rows = await plan_tasks(db, plan.plan_id)
    # One task for the whole day missed (plus, at most, one fire time still within the 1 s grace).
    assert result.skipped_missed is True
    assert 1 <= len(rows) <= 2
    caught_up = rows[0]["available_at"]
    # Kolkata is UTC+05:30, so its five-minute marks are UTC five-minute marks too.
    assert caught_up.minute % 5 == 0 and (caught_up.second, caught_up.microsecond) == (0, 0)
    assert before - seconds(1) - seconds(300) < caught_up <= after
    next_fire_at = (await plan_row(db, plan.plan_id))["next_fire_at"]
    assert next_fire_at - rows[-1]["available_at"] == seconds(300)


async def test_the_database_clock_decides_what_is_due(db):
    owner = await tenant(db)
    store = PlanStore(db)
    plan = await create_plan(db, owner, definition(interval_s=60, grace_s=3600))
    with trio.fail_after(TEST_TIMEOUT_S):
        # Two seconds ahead of NOW(6): not due, whatever a node's clock might say.
        await db.run(
            lambda tx: tx.execute_raw(
                "UPDATE plans SET next_fire_at = NOW(6) + INTERVAL 2 SECOND WHERE plan_id = %s", (plan.plan_id,)
            )
        )
        assert await store.due(10) == []
        assert (await store.fire(plan.plan_id, limit=10)).locked is False
        # A millisecond behind NOW(6): due.
        await db.run(
            lambda tx: tx.execute_raw(
                "UPDATE plans SET next_fire_at = NOW(6) - INTERVAL 1000 MICROSECOND WHERE plan_id = %s",
                (plan.plan_id,),
            )
        )
        assert await store.due(10) == [plan.plan_id]
        result = await store.fire(plan.plan_id, limit=10)
    assert result.created == 1
    assert len(await plan_tasks(db, plan.plan_id)) == 1


async def test_a_plan_another_node_holds_is_skipped_not_waited_for(db, dsn):
    owner = await tenant(db)
    t0 = await whole_second(db) - seconds(10)
    plan = await create_plan(db, owner, definition(interval_s=1, start_at=t0, end_at=t0 + seconds(5), grace_s=3600))
    await set_next_fire(db, plan.plan_id, t0)
    other = Database(dsn, size=1)
    held, release = trio.Event(), trio.Event()

    async def hold(tx):
        await tx.fetchall_raw("SELECT plan_id FROM plans WHERE plan_id = %s FOR UPDATE", (plan.plan_id,))
        held.set()
        await release.wait()

    try:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(other.transaction, hold)
                await held.wait()
                # The innodb lock wait timeout is 50 s; SKIP LOCKED answers at once.
                with trio.fail_after(5):
                    skipped = await PlanStore(db).fire(plan.plan_id, limit=100)
                release.set()
            fired = await PlanStore(db).fire(plan.plan_id, limit=100)
    finally:
        with trio.CancelScope(shield=True):
            await other.aclose()
    assert (skipped.locked, skipped.created) == (False, 0)
    assert (fired.locked, fired.created) == (True, 6)


async def test_a_paused_plan_creates_nothing_and_resuming_skips_the_pause(db):
    owner = await tenant(db)
    store = PlanStore(db)
    t0 = await whole_second(db) - seconds(100)
    plan = await create_plan(db, owner, definition(interval_s=10, start_at=t0, grace_s=3600))
    paused = await store.set_paused(owner.namespace_id, plan.plan_id, True)
    assert (paused.paused, paused.next_fire_at) == (True, None)
    with trio.fail_after(TEST_TIMEOUT_S):
        # Even a due next_fire_at written by hand does not fire while paused.
        await set_next_fire(db, plan.plan_id, t0)
        assert await store.due(10) == []
        assert (await store.fire(plan.plan_id, limit=100)).locked is False
        resumed = await store.set_paused(owner.namespace_id, plan.plan_id, False)
        now = await db_now(db)
    assert resumed.paused is False
    # The fire times that passed during the pause are not created: the next one is in the future.
    assert now - seconds(1) <= resumed.next_fire_at <= now + seconds(10)
    assert (resumed.next_fire_at - t0).total_seconds() % 10 == 0
    assert await plan_tasks(db, plan.plan_id) == []


async def test_a_version_that_cannot_be_read_stops_the_plan_instead_of_failing_every_pass(db, caplog):
    owner = await tenant(db)
    store = PlanStore(db)
    t0 = await whole_second(db) - seconds(10)
    plan = await create_plan(db, owner, definition(interval_s=1, start_at=t0, grace_s=3600))
    await set_next_fire(db, plan.plan_id, t0)
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE plan_versions SET definition = %s WHERE plan_id = %s",
            (json.dumps(definition(interval_s=0)), plan.plan_id),
        )
    )
    trigger = PlanTrigger(store, interval_s=1)
    with trio.fail_after(TEST_TIMEOUT_S), caplog.at_level(logging.ERROR, logger="orbit.plans"):
        stats = await trigger.trigger_once()
    assert (stats.plans_fired, stats.tasks_created) == (1, 0)
    assert (await plan_row(db, plan.plan_id))["next_fire_at"] is None
    assert "definition.schedule.interval_s" in caplog.text
    assert await plan_tasks(db, plan.plan_id) == []


async def test_the_plan_service_of_a_node_creates_due_tasks(db, node_config):
    owner = await tenant(db)
    t0 = await whole_second(db) - seconds(30)
    plan = await create_plan(db, owner, definition(interval_s=5, start_at=t0, end_at=t0 + seconds(20), grace_s=3600))
    await set_next_fire(db, plan.plan_id, t0)
    node = Node(node_config, services=ServiceSet(plans=True))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            trigger = await nursery.start(node.state.services.shards.main.trigger.run)
            while trigger.passes < 1:
                await trigger.wait_for_pass()
            nursery.cancel_scope.cancel()
    assert node.state.services.shards.main.trigger is trigger
    assert trigger.totals.tasks_created == 5
    assert [r["available_at"] for r in await plan_tasks(db, plan.plan_id)] == [t0 + seconds(5 * k) for k in range(5)]


async def test_a_fire_that_created_tasks_wakes_their_queue_once_committed(db):
    """The trigger tells the node's claim pool (``tasks_arrived``) which queue got tasks, so
    its waiting Workers ask at once instead of after their cached empty result expires."""
    owner = await tenant(db)
    t0 = await whole_second(db) - seconds(120)
    due = await create_plan(db, owner, definition(interval_s=60, start_at=t0, grace_s=3600))
    await set_next_fire(db, due.plan_id, t0)
    idle = await create_plan(db, owner, definition(interval_s=60, grace_s=3600), name="later")
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE plans SET next_fire_at = NOW(6) + INTERVAL 1 HOUR WHERE plan_id = %s", (idle.plan_id,)
        )
    )
    woken: list[str] = []

    def arrived(queue_id: str) -> None:
        # Called after the commit: the tasks are visible to another session by then.
        woken.append(queue_id)

    trigger = PlanTrigger(PlanStore(db), 1.0, tasks_arrived=arrived)
    with trio.fail_after(TEST_TIMEOUT_S):
        stats = await trigger.trigger_once()
        assert stats.tasks_created == 3 and woken == [owner.queue_id]
        assert len(await plan_tasks(db, due.plan_id)) == 3
        # A pass that creates nothing wakes nothing.
        await trigger.trigger_once()
    assert woken == [owner.queue_id]
