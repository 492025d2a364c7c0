"""Recovery: expired leases and deadlines settled from the database clock, concurrently and safely."""

from __future__ import annotations

import json

import pytest
import trio

from harness.clock import LaterDatabase
from orbit_node.db import Database
from orbit_node.dispatch.recovery import Sweeper
from orbit_node.domain.ownership import FinishItem, LostReason, Outcome, OwnershipLost, RecoveryStats

from ..helpers import wait_until
from ..seed import (
    TaskSpec,
    attempt_rows,
    claim_request,
    expire_lease,
    insert_task,
    insert_tasks,
    lease_store,
    task_row,
    tenant,
)


async def claimed(db, store, *, start=False, **spec):
    owner = await tenant(db)
    await insert_task(db, owner, available_in_s=-1, **spec)
    (r,) = await store.claim(claim_request(owner, resource_key_support=True))
    if start:
        await store.start(r.task_id, r.fencing_token)
    return owner, r


async def test_an_expired_reservation_is_queued_again_without_using_an_attempt(db):
    store = lease_store(db)
    _, r = await claimed(db, store, resource_key="k")
    before = await task_row(db, r.task_id)
    await expire_lease(db, r.task_id)
    assert await store.recover() == RecoveryStats(requeued=1)
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"], row["fencing_token"], row["owner_node_id"]) == ("queued", 0, None, None)
    assert row["available_at"] == before["available_at"]
    assert [a["outcome"] for a in await attempt_rows(db, r.task_id)] == ["reservation_expired"]
    holders = await db.run(lambda tx: tx.fetchall_raw("SELECT holder_task_id FROM resource_keys"))
    assert holders == [{"holder_task_id": None}]


async def test_an_expired_run_lease_is_a_failed_attempt_retried_with_backoff(db):
    store = lease_store(db)
    owner, r = await claimed(db, store, start=True, backoff_initial_ms=60_000)
    await expire_lease(db, r.task_id)
    assert await store.recover() == RecoveryStats(retried=1)
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"]) == ("queued", 1)
    assert json.loads(row["error"])["code"] == "LEASE_EXPIRED"
    assert row["available_at"] > row["updated_at"]
    assert [a["outcome"] for a in await attempt_rows(db, r.task_id)] == ["lease_expired"]
    assert await store.claim(claim_request(owner)) == []  # backoff: not due yet


async def test_an_expired_run_lease_on_the_last_attempt_fails_the_task(db):
    store = lease_store(db)
    _, r = await claimed(db, store, start=True, max_attempts=1)
    await expire_lease(db, r.task_id)
    assert await store.recover() == RecoveryStats(failed=1)
    assert (await task_row(db, r.task_id))["state"] == "failed"


@pytest.mark.parametrize("start", [False, True], ids=["reserved", "running"])
async def test_cancel_requested_tasks_whose_lease_expired_are_cancelled(db, start):
    store = lease_store(db)
    _, r = await claimed(db, store, start=start)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET cancel_requested = 1"))
    await expire_lease(db, r.task_id)
    assert await store.recover() == RecoveryStats(cancelled=1)
    row = await task_row(db, r.task_id)
    assert row["state"] == "cancelled"
    assert json.loads(row["error"])["code"] == "CANCELLED"
    # The attempt is closed in the same statement, with its own outcome and error.
    (attempt,) = await attempt_rows(db, r.task_id)
    expected = ("lease_expired", "LEASE_EXPIRED") if start else ("reservation_expired", "CANCELLED")
    assert (attempt["outcome"], json.loads(attempt["error"])["code"]) == expected
    assert attempt["finished_at"] is not None


async def test_queued_tasks_past_their_deadline_expire(db):
    owner = await tenant(db)
    late, on_time, no_deadline = await insert_tasks(
        db,
        owner,
        [
            TaskSpec(available_in_s=3600, deadline_in_s=-0.001),
            TaskSpec(deadline_in_s=60),
            TaskSpec(),
        ],
    )
    assert await lease_store(db).recover() == RecoveryStats(expired=1)
    assert (await task_row(db, late))["state"] == "expired"
    assert (await task_row(db, on_time))["state"] == "queued"
    assert (await task_row(db, no_deadline))["state"] == "queued"


async def test_a_valid_lease_is_never_touched(db):
    """Whatever the node's clock says: only NOW(6) decides, and these leases are valid on it."""
    store = lease_store(db)
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, deadline_in_s=0.5) for _ in range(3)])
    reserved, running, past_deadline = await store.claim(claim_request(owner))
    await store.start(running.task_id, running.fencing_token)
    # Past its deadline but holding a valid reservation: Start or the lease settles it, not the sweeper.
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET deadline = NOW(6) - INTERVAL 1 SECOND WHERE task_id = %s", (past_deadline.task_id,)
        )
    )
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET lease_expires_at = NOW(6) + INTERVAL 1 SECOND"))
    before = [await task_row(db, t.task_id) for t in (reserved, running, past_deadline)]
    assert await store.recover() == RecoveryStats()
    assert [await task_row(db, t.task_id) for t in (reserved, running, past_deadline)] == before


async def test_stale_tokens_are_refused_after_recovery_requeued_the_task(db):
    store = lease_store(db)
    owner, old = await claimed(db, store)
    await expire_lease(db, old.task_id)
    await store.recover()
    with pytest.raises(OwnershipLost) as info:
        await store.start(old.task_id, old.fencing_token)
    assert info.value.reason is LostReason.TOKEN_MISMATCH
    (new,) = await store.claim(claim_request(owner))
    assert new.fencing_token != old.fencing_token
    for transition in (store.start, store.renew):
        with pytest.raises(OwnershipLost):
            await transition(old.task_id, old.fencing_token)
    await store.start(new.task_id, new.fencing_token)
    with pytest.raises(OwnershipLost):
        await store.finish(old.task_id, old.fencing_token, result_json="1")
    assert (await store.finish(new.task_id, new.fencing_token, result_json="2")).outcome is Outcome.SUCCEEDED
    assert (await task_row(db, new.task_id))["result"] == "2"


async def wait_until_a_statement_waits_for_the_row(db):
    """Until another connection of this database runs a locking read of the tasks table
    (it cannot finish while the test holds the row)."""
    query = (
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() "
        "AND COMMAND = 'Query' AND INFO LIKE 'SELECT task_id%%FOR UPDATE'"
    )

    async def waiting() -> int:
        return (await db.run(lambda tx: tx.fetchall_raw(query)))[0]["n"]

    await wait_until(waiting)


async def test_finish_racing_recovery_recovery_first(db):
    """The sweeper holds the expired row; Finish waits for the lock, then is refused:
    exactly one settlement (the sweeper's)."""
    locked, release = trio.Event(), trio.Event()

    async def hook(point, task_ids):
        if point == "recover.locked" and task_ids:
            locked.set()
            await release.wait()

    store = lease_store(db)
    _, r = await claimed(db, store, start=True)
    await expire_lease(db, r.task_id)
    sweeper = lease_store(db, hook=hook)
    finish_result = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweeper.recover)
        with trio.fail_after(10):
            await locked.wait()

        async def finish():
            finish_result.extend(await store.finish_many([_success(r)]))

        nursery.start_soon(finish)
        await wait_until_a_statement_waits_for_the_row(db)
        release.set()
    assert finish_result[0].outcome is Outcome.OWNERSHIP_LOST
    row = await task_row(db, r.task_id)
    assert (row["state"], row["result"]) == ("queued", None)
    assert [a["outcome"] for a in await attempt_rows(db, r.task_id)] == ["lease_expired"]


async def test_finish_racing_recovery_finish_first(db, dsn):
    """Finish locks the row while its lease is valid; the sweeper, whose session runs on
    the database clock of a later moment (``LaterDatabase``), sees the lease expired but
    skips the locked row; Finish commits: exactly one settlement (the Finish)."""
    locked, release = trio.Event(), trio.Event()

    async def hook(point, task_ids):
        if point == "finish.locked":
            locked.set()
            await release.wait()

    store = lease_store(db)
    _, r = await claimed(db, store, start=True)
    later_db = LaterDatabase(dsn, size=1, ahead_s=3600)
    finisher = lease_store(db, hook=hook)
    finish_result = []
    try:
        sweeper = lease_store(later_db)
        async with trio.open_nursery() as nursery:

            async def finish():
                finish_result.extend(await finisher.finish_many([_success(r)]))

            nursery.start_soon(finish)
            with trio.fail_after(10):
                await locked.wait()
            # For the sweeper's clock the lease is over: it finds the row, and skips it.
            lapsed = await later_db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT lease_expires_at < NOW(6) AS gone FROM tasks WHERE task_id = %s", (r.task_id,)
                )
            )
            assert lapsed[0]["gone"]
            with trio.fail_after(10):
                assert await sweeper.recover() == RecoveryStats()  # skipped the locked row, did not wait
            release.set()
    finally:
        await later_db.aclose()
    assert finish_result[0].outcome is Outcome.SUCCEEDED
    assert await store.recover() == RecoveryStats()
    row = await task_row(db, r.task_id)
    assert (row["state"], row["result"]) == ("succeeded", '"done"')
    assert [a["outcome"] for a in await attempt_rows(db, r.task_id)] == ["succeeded"]


def _success(r):
    return FinishItem(r.task_id, r.fencing_token, '"done"')


async def test_concurrent_sweepers_settle_each_row_once(db, dsn):
    store = lease_store(db)
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(300)])
    claimed_ids = []
    for _ in range(19):
        claimed_ids += [r.task_id for r in await store.claim(claim_request(owner))]
    assert len(claimed_ids) == 300
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET lease_expires_at = NOW(6) - INTERVAL 1 SECOND"))
    pools = [Database(dsn, size=1) for _ in range(4)]
    totals = []

    async def sweep(pool):
        sweeper = lease_store(pool)
        while (stats := await sweeper.recover(limit=40)).total or stats.saturated:
            totals.append(stats)

    try:
        async with trio.open_nursery() as nursery:
            for pool in pools:
                nursery.start_soon(sweep, pool)
    finally:
        for pool in pools:
            await pool.aclose()
    assert sum(s.requeued for s in totals) == 300
    outcomes = await db.run(
        lambda tx: tx.fetchall_raw("SELECT outcome, COUNT(*) AS n FROM task_attempts GROUP BY outcome")
    )
    assert outcomes == [{"outcome": "reservation_expired", "n": 300}]


async def test_recovery_service_sweeps_on_its_interval(db, node_config):
    store = lease_store(db)
    _, r = await claimed(db, store)
    await expire_lease(db, r.task_id)
    async with trio.open_nursery() as nursery:
        sweeper = await nursery.start(Sweeper(store, node_config.sweep_interval_s).run)
        with trio.fail_after(10):
            await sweeper.wait_for_pass()
        nursery.cancel_scope.cancel()
    assert sweeper.totals.requeued == 1
    assert (await task_row(db, r.task_id))["state"] == "queued"


async def test_each_application_is_recovered_in_its_own_transaction(db):
    """The shard key (docs/scaling.md): one sweep over two applications' expired leases
    locks and settles each application's tasks in a transaction of its own."""
    store = lease_store(db)
    owners = [await tenant(db, application=name) for name in ("shard-a", "shard-b")]
    claimed_ids = {}
    for owner in owners:
        ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-1), TaskSpec(available_in_s=-1)])
        assert len(await store.claim(claim_request(owner))) == 2
        claimed_ids[owner.application_id] = set(ids)
        for task_id in ids:
            await expire_lease(db, task_id)
    locked: list[set[str]] = []

    async def hook(point, task_ids):
        if point == "recover.locked":
            locked.append(set(task_ids))

    store.hook = hook
    assert await store.recover() == RecoveryStats(requeued=4)
    assert sorted(locked, key=sorted) == sorted(claimed_ids.values(), key=sorted)


async def test_the_sweeper_announces_each_queue_it_put_tasks_back_in_after_the_commit(db, node_config):
    """What a pass requeues wakes waiting claims on every node (through the signals):
    an expired reservation is due now, a retried run lease when its backoff ends; a task
    that failed for good announces nothing."""
    store = lease_store(db)
    heard = []

    def tasks_arrived(queue_id, due_at, due_in_s):
        # Called after the commit: the row is queued already.
        heard.append((queue_id, due_at, due_in_s))

    owner, reserved = await claimed(db, store)
    _, running = await claimed(db, store, start=True, backoff_initial_ms=60_000)
    _, last = await claimed(db, store, start=True, max_attempts=1)
    for r in (reserved, running, last):
        await expire_lease(db, r.task_id)
    sweeper = Sweeper(store, node_config.sweep_interval_s, tasks_arrived=tasks_arrived)
    assert await sweeper.sweep() == RecoveryStats(requeued=1, retried=1, failed=1)
    queue_of = {r.task_id: (await task_row(db, r.task_id))["queue_id"] for r in (reserved, running)}
    retried = await task_row(db, running.task_id)
    now_due, later = sorted(heard, key=lambda h: h[1] is not None)
    assert now_due == (queue_of[reserved.task_id], None, None)
    # The backoff (60 s, jittered) as the transaction's own clock measured it.
    assert later[:2] == (queue_of[running.task_id], retried["available_at"]) and 0 < later[2] <= 60.0


async def test_a_resource_key_the_sweeper_frees_wakes_its_queue_at_once(db, node_config):
    """A keyed task that the sweeper fails for good, or retries after a backoff, gives its
    key up now: its queue is announced as due now, for a task waiting for that key."""
    store = lease_store(db)
    heard = []
    _, done = await claimed(db, store, start=True, max_attempts=1, resource_key="k1")
    _, later = await claimed(db, store, start=True, backoff_initial_ms=60_000, resource_key="k2")
    for r in (done, later):
        await expire_lease(db, r.task_id)
    sweeper = Sweeper(store, node_config.sweep_interval_s, tasks_arrived=lambda *h: heard.append(h))
    assert await sweeper.sweep() == RecoveryStats(retried=1, failed=1)
    queue_id = (await task_row(db, done.task_id))["queue_id"]
    assert (queue_id, None, None) in heard
    retried = await task_row(db, later.task_id)
    assert [h[:2] for h in heard if h[1] is not None] == [(queue_id, retried["available_at"])]
