"""Quotas and permits hold atomically under concurrent claimers on separate connections."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio

from orbit_node.db import Database
from orbit_node.domain.ownership import FinishItem
from orbit_node.domain.quota import epoch_second, quota_budget, window_after
from orbit_node.store.tenancy import TenancyStore

from ..seed import TaskSpec, add_queue, claim_request, insert_tasks, lease_store, tenant

CLAIMERS = 8


@pytest.fixture
async def pools(dsn):
    """One single-connection pool per claimer: every claim runs on its own connection."""
    pools = [Database(dsn, size=1) for _ in range(CLAIMERS)]
    try:
        yield pools
    finally:
        with trio.CancelScope(shield=True):
            for pool in pools:
                await pool.aclose()


async def claim_all_at_once(pools, request_for):
    """Run one claim per pool concurrently, released together by an event."""
    go = trio.Event()
    results = [None] * len(pools)

    async def one(index, pool):
        store = lease_store(pool)
        await go.wait()
        results[index] = await store.claim(request_for(index))

    async with trio.open_nursery() as nursery:
        for index, pool in enumerate(pools):
            nursery.start_soon(one, index, pool)
        await trio.testing.wait_all_tasks_blocked()
        go.set()
    return [r for batch in results for r in batch]


async def live_count(db, column, value):
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            f"SELECT COUNT(*) AS n FROM tasks WHERE {column} = %s AND state IN ('reserved', 'running')", (value,)
        )
    )
    return rows[0]["n"]


async def finish_some(db, reservations, count):
    store = lease_store(db)
    chosen = random.sample(reservations, count)
    await store.start_many([(r.task_id, r.fencing_token) for r in chosen])
    results = await store.finish_many([FinishItem(r.task_id, r.fencing_token, "null") for r in chosen])
    assert all(x.ok for x in results)
    return [r for r in reservations if r not in chosen]


async def test_application_concurrency_cap_holds_under_concurrent_claimers(db, pools):
    owner = await tenant(db)
    other_queue = await add_queue(db, owner, "second")
    await TenancyStore(db).set_application_quota(
        owner.application_id, max_concurrent_executions=5, max_starts_per_second=None
    )
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(60)])
    await insert_tasks(db, other_queue, [TaskSpec(available_in_s=-1) for _ in range(60)])
    # Claimers spread over both queues of the application: the cap is per application.
    queues = (owner.queue_id, other_queue.queue_id)
    live = []
    for round_ in range(6):
        live += await claim_all_at_once(
            pools, lambda i: claim_request(owner, queue_ids=(queues[i % 2],), connection_id=f"c{i}")
        )
        assert len(live) == 5, f"round {round_}: {len(live)} live reservations"
        assert await live_count(db, "application_id", owner.application_id) == 5
        live = await finish_some(db, live, 1 + round_ % 3)


async def test_queue_concurrency_cap_holds_and_other_queues_are_unaffected(db, pools):
    owner = await tenant(db, max_concurrency=3)
    free = await add_queue(db, owner, "free")
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(40)])
    await insert_tasks(db, free, [TaskSpec(available_in_s=-1) for _ in range(40)])
    live = []
    for _round in range(4):
        got = await claim_all_at_once(pools, lambda i: claim_request(owner, limit=4, connection_id=f"c{i}"))
        live += got
        assert len(live) == 3
        assert await live_count(db, "queue_id", owner.queue_id) == 3
        live = await finish_some(db, live, 2)
    # The capped queue is full; the other queue of the same application is not held back.
    assert len(await lease_store(db).claim(claim_request(free, limit=16))) == 16


@pytest.mark.parametrize("scope", ["application", "queue"])
async def test_start_rate_holds_per_database_second(db, pools, scope):
    owner = await tenant(db, max_starts_per_second=3 if scope == "queue" else None)
    if scope == "application":
        await TenancyStore(db).set_application_quota(
            owner.application_id, max_concurrent_executions=None, max_starts_per_second=3
        )
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(100)])
    got = []
    for _ in range(3):
        got += await claim_all_at_once(pools, lambda i: claim_request(owner, connection_id=f"c{i}"))
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT reserved_at FROM tasks WHERE state = 'reserved'"))
    per_second = Counter(epoch_second(r["reserved_at"]) for r in rows)
    assert len(rows) == len(got) >= 3
    assert max(per_second.values()) <= 3, per_second


async def test_a_full_start_window_grants_nothing_until_the_next_second(db):
    owner = await tenant(db, max_starts_per_second=2)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(10)])
    store = lease_store(db)
    first = await store.claim(claim_request(owner))
    second = await store.claim(claim_request(owner))
    window = await db.run(lambda tx: tx.fetchall_raw("SELECT start_window_s, start_window_count FROM queues"))
    # Either both claims fell in one database second (the second got nothing), or the
    # second claim opened the next window; never more than 2 in one second.
    assert len(first) == 2
    if second:
        assert epoch_second(second[0].lease_expires_at) >= window[0]["start_window_s"]
        assert {epoch_second(r.lease_expires_at) for r in second} != {epoch_second(r.lease_expires_at) for r in first}
    # A window in the past no longer counts.
    await db.run(
        lambda tx: tx.execute_raw("UPDATE queues SET start_window_s = UNIX_TIMESTAMP() - 5, start_window_count = 2")
    )
    assert len(await store.claim(claim_request(owner))) == 2


async def test_resource_key_exclusivity_under_concurrent_claimers(db, pools):
    owner = await tenant(db)
    other_ns = await tenant(db, namespace="other")
    keyed = await insert_tasks(db, owner, [TaskSpec(available_in_s=-10 + i, resource_key="disk-1") for i in range(6)])
    (other_key,) = await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, resource_key="disk-2")])
    (same_key_elsewhere,) = await insert_tasks(db, other_ns, [TaskSpec(available_in_s=-1, resource_key="disk-1")])
    got = await claim_all_at_once(
        pools, lambda i: claim_request(owner, resource_key_support=True, connection_id=f"c{i}")
    )
    assert sorted(r.task_id for r in got) == sorted([keyed[0], other_key])
    got_elsewhere = await lease_store(db).claim(claim_request(other_ns, resource_key_support=True))
    assert [r.task_id for r in got_elsewhere] == [same_key_elsewhere]
    # The key passes on, in dispatch order, only when its holder finishes.
    holder = next(r for r in got if r.task_id == keyed[0])
    store = lease_store(db)
    assert await store.claim(claim_request(owner, resource_key_support=True)) == []
    await store.start(holder.task_id, holder.fencing_token)
    await store.finish(holder.task_id, holder.fencing_token, result_json="1")
    again = await claim_all_at_once(
        pools, lambda i: claim_request(owner, resource_key_support=True, connection_id=f"d{i}")
    )
    assert [r.task_id for r in again] == [keyed[1]]


def test_quota_budget_rules():
    unlimited = quota_budget(max_concurrent=None, live=7, max_per_second=None, window_s=0, window_count=0, now_s=100)
    assert unlimited.window_s is None and unlimited.remaining > 1_000_000
    assert (
        quota_budget(max_concurrent=5, live=3, max_per_second=None, window_s=0, window_count=0, now_s=1).remaining == 2
    )
    assert (
        quota_budget(max_concurrent=5, live=9, max_per_second=None, window_s=0, window_count=0, now_s=1).remaining == 0
    )
    # Same second: the stored count applies; an older window starts afresh.
    same = quota_budget(max_concurrent=None, live=0, max_per_second=4, window_s=100, window_count=3, now_s=100)
    assert (same.remaining, same.window_s, same.window_used) == (1, 100, 3)
    fresh = quota_budget(max_concurrent=None, live=0, max_per_second=4, window_s=99, window_count=4, now_s=100)
    assert (fresh.remaining, fresh.window_s, fresh.window_used) == (4, 100, 0)
    # A later stored window (the claim read the clock before it waited for the lock) counts.
    later = quota_budget(max_concurrent=None, live=0, max_per_second=4, window_s=101, window_count=4, now_s=100)
    assert later.remaining == 0
    both = quota_budget(max_concurrent=10, live=9, max_per_second=4, window_s=0, window_count=0, now_s=100)
    assert both.remaining == 1
    # The stored window follows the second the reservations carry.
    assert window_after(same, 1, 100) == (100, 4)
    assert window_after(same, 1, 101) == (101, 1)
