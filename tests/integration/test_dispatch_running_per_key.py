"""A queue's max_running_per_key: at most N tasks of one resource key reserved or running
at once, whatever the number of claimers and nodes (docs/dispatch.md, "Resource keys").

Overlaps are read back from the attempt rows (``task_attempts.started_at`` /
``finished_at``, both the database clock): a task starts only after the claim that
reserved it committed, and that claim saw the key's place free only after the
transition that freed it committed, so two attempts that ran one after the other never
look overlapping."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import trio

from orbit_node.db import Database
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.store.tasks import TaskStore
from orbit_node.store.tenancy import TenancyStore

from ..seed import TaskSpec, add_queue, claim_request, count_states, expire_lease, insert_tasks, lease_store, tenant

NODES = 2
CLAIMERS_PER_NODE = 4


async def attempts_by_key(db) -> dict[str, list[tuple]]:
    """Each resource key's attempts as (started_at, finished_at), every one of them finished."""
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT t.resource_key, a.started_at, a.finished_at, a.outcome FROM task_attempts a"
            " JOIN tasks t ON t.task_id = a.task_id WHERE t.resource_key IS NOT NULL"
        )
    )
    found: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        assert row["outcome"] == "succeeded" and row["started_at"] is not None, row
        found[row["resource_key"]].append((row["started_at"], row["finished_at"]))
    return found


def most_at_once(intervals) -> int:
    """The most intervals [start, finish) that overlap at any instant (a finish and a
    start at the same microsecond do not overlap)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(finish, -1) for _, finish in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


async def further_holders(db) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM resource_key_holders"))
    return rows[0]["n"]


async def drain_from_nodes(dsn, owner, *, seen_further: list[int] | None = None) -> None:
    """``NODES`` nodes (each its own pool and store) of ``CLAIMERS_PER_NODE`` Worker
    connections claiming (up to 4 at a time), starting, running for a few milliseconds
    and finishing, concurrently, until the queue is empty. ``seen_further`` receives the
    number of further-holder rows after each claim."""
    pools = [Database(dsn, size=CLAIMERS_PER_NODE + 1) for _ in range(NODES)]
    rng = random.Random(7)

    async def claimer(store, node: int, index: int) -> None:
        request = claim_request(
            owner, limit=4, resource_key_support=True, node_id=f"{node:032x}", connection_id=f"conn-{node}-{index}"
        )
        while True:
            taken = await store.claim(request)
            if seen_further is not None:
                seen_further.append(await further_holders(store.db))
            if not taken:
                if not set(await count_states(store.db)) & {"queued", "reserved", "running"}:
                    return
                await trio.sleep(0.005)
                continue
            started = await store.start_many([(r.task_id, r.fencing_token) for r in taken])
            assert all(s.outcome is Outcome.STARTED for s in started)
            await trio.sleep(rng.uniform(0.005, 0.03))
            await store.finish_many(FinishItem(r.task_id, r.fencing_token, "null") for r in taken)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for node, pool in enumerate(pools):
                    store = lease_store(pool)
                    for index in range(CLAIMERS_PER_NODE):
                        nursery.start_soon(claimer, store, node, index)
    finally:
        for pool in pools:
            await pool.aclose()


async def test_n_per_key_holds_under_concurrent_claimers_on_two_nodes(db, dsn):
    owner = await tenant(db, max_running_per_key=3)
    specs = [TaskSpec(available_in_s=-1, resource_key="k") for _ in range(30)]
    specs += [TaskSpec(available_in_s=-1, resource_key="j") for _ in range(15)]
    specs += [TaskSpec(available_in_s=-1) for _ in range(10)]
    await insert_tasks(db, owner, specs)
    await drain_from_nodes(dsn, owner)
    assert await count_states(db) == {"succeeded": 55}
    ran = await attempts_by_key(db)
    assert (len(ran["k"]), len(ran["j"])) == (30, 15)
    # Never a fourth, and the key is used up to its limit (the claimers ask for more).
    assert (most_at_once(ran["k"]), most_at_once(ran["j"])) == (3, 3)
    # Every holder was released with its task.
    assert await further_holders(db) == 0
    keys = await db.run(lambda tx: tx.fetchall_raw("SELECT holder_task_id FROM resource_keys"))
    assert [k["holder_task_id"] for k in keys] == [None, None]


async def test_the_default_is_one_at_a_time_through_the_key_row_alone(db, dsn):
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, resource_key=f"k{i % 2}") for i in range(24)])
    seen_further: list[int] = []
    await drain_from_nodes(dsn, owner, seen_further=seen_further)
    assert await count_states(db) == {"succeeded": 24}
    ran = await attempts_by_key(db)
    assert {key: most_at_once(intervals) for key, intervals in ran.items()} == {"k0": 1, "k1": 1}
    # As before the control: the key's row is its only holder; no further holder is written.
    assert seen_further and set(seen_further) == {0}


async def held_claim(db, owner, nursery, *, limit: int):
    """A claim that pauses, transaction open (its key rows locked), once it reserved."""
    reserved, release, result = trio.Event(), trio.Event(), []

    async def hook(point, task_ids):
        if point == "claim.reserved":
            reserved.set()
            await release.wait()

    async def run():
        store = lease_store(db, hook=hook)
        result.extend(await store.claim(claim_request(owner, limit=limit, resource_key_support=True)))

    nursery.start_soon(run)
    with trio.fail_after(10):
        await reserved.wait()
    return release, result


async def test_a_claim_passes_over_a_key_another_claim_holds_without_waiting(db):
    owner = await tenant(db, max_running_per_key=3)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-10 + i, resource_key="k") for i in range(6)])
    store = lease_store(db)
    async with trio.open_nursery() as nursery:
        release, first = await held_claim(db, owner, nursery, limit=1)
        # The key's row is locked by the open claim: another claim takes none of the key's
        # tasks this time, and does not wait for it.
        with trio.fail_after(5):
            assert await store.claim(claim_request(owner, limit=6, resource_key_support=True, connection_id="c2")) == []
        release.set()
    assert [r.task_id for r in first] == ids[:1]
    # Once it committed: what is left of the key, in order, and then nothing.
    second = await store.claim(claim_request(owner, limit=6, resource_key_support=True, connection_id="c2"))
    assert [r.task_id for r in second] == ids[1:3]
    assert await store.claim(claim_request(owner, limit=6, resource_key_support=True, connection_id="c3")) == []
    assert await further_holders(db) == 2
    # A place freed (a finish) admits one more.
    await store.start(first[0].task_id, first[0].fencing_token)
    await store.finish_many([FinishItem(first[0].task_id, first[0].fencing_token, "null")])
    third = await store.claim(claim_request(owner, limit=6, resource_key_support=True, connection_id="c3"))
    assert [r.task_id for r in third] == ids[3:4]


async def test_lowering_the_limit_cancels_nothing_and_lets_the_excess_drain(db):
    owner = await tenant(db, max_running_per_key=3)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-10 + i, resource_key="k") for i in range(5)])
    store = lease_store(db)
    running = await store.claim(claim_request(owner, limit=5, resource_key_support=True))
    assert [r.task_id for r in running] == ids[:3]
    await store.start_many([(r.task_id, r.fencing_token) for r in running])
    await TenancyStore(db).update_queue_controls(owner.namespace_id, owner.queue_id, {"max_running_per_key": 2})
    # 3 hold the key, 2 are admitted: nothing new until fewer than 2 hold it.
    assert await store.claim(claim_request(owner, limit=5, resource_key_support=True)) == []
    explanation = await store.explain(owner.namespace_id, ids[3])
    held = next(r for r in explanation["reasons"] if r["code"] == "RESOURCE_KEY_HELD")
    assert held["message"] == "resource key 'k' has 3 of 2 running"
    assert (held["running"], held["limit"], held["holder_task_ids"]) == (3, 2, sorted(ids[:3]))
    await store.finish_many([FinishItem(running[0].task_id, running[0].fencing_token, "null")])
    assert await store.claim(claim_request(owner, limit=5, resource_key_support=True)) == []
    await store.finish_many([FinishItem(running[1].task_id, running[1].fencing_token, "null")])
    (admitted,) = await store.claim(claim_request(owner, limit=5, resource_key_support=True))
    assert admitted.task_id == ids[3]
    await store.finish_many([FinishItem(running[2].task_id, running[2].fencing_token, "null")])
    # Nothing was cancelled: the three ran to their end.
    states = await db.run(
        lambda tx: tx.fetchall_raw("SELECT task_id, state FROM tasks WHERE task_id IN %s", (tuple(ids[:3]),))
    )
    assert {r["state"] for r in states} == {"succeeded"}


async def test_each_queue_admits_its_own_limit_on_a_shared_key(db):
    wide = await tenant(db, max_running_per_key=3)
    narrow = await add_queue(db, wide, "narrow")
    await insert_tasks(db, wide, [TaskSpec(available_in_s=-1, resource_key="k") for _ in range(4)])
    (narrow_task,) = await insert_tasks(db, narrow, [TaskSpec(available_in_s=-1, resource_key="k")])
    store = lease_store(db)
    # One holder: the narrow queue (1 at a time) admits nothing more, the wide one 2 more.
    (first,) = await store.claim(claim_request(wide, limit=1, resource_key_support=True))
    assert await store.claim(claim_request(narrow, resource_key_support=True)) == []
    assert len(await store.claim(claim_request(wide, resource_key_support=True))) == 2
    # A listing says why the narrow queue's task waits (a Worker able to run it is connected).
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO worker_connections (connection_id, node_id, namespace_id, queues, capabilities,"
            ' resource_key_support) VALUES (\'conn-narrow\', %s, %s, %s, \'[["h", "v1", "v1"]]\', 1)',
            ("9" * 32, narrow.namespace_id, json.dumps([narrow.queue_id])),
        )
    )
    tasks = TaskStore(db)
    page = await tasks.list(narrow.namespace_id, queue_id=narrow.queue_id)
    assert await tasks.waiting_reasons(narrow.namespace_id, page.tasks) == {narrow_task: "RESOURCE_KEY_HELD"}
    # Once the wide queue's first holder is gone, 2 hold the key: still more than 1.
    await store.start(first.task_id, first.fencing_token)
    await store.finish_many([FinishItem(first.task_id, first.fencing_token, "null")])
    assert await store.claim(claim_request(narrow, resource_key_support=True)) == []


async def test_an_explanation_counts_the_holders_against_the_queue_limit(db):
    owner = await tenant(db, max_running_per_key=2)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-10 + i, resource_key="k") for i in range(3)])
    store = lease_store(db)
    (first,) = await store.claim(claim_request(owner, limit=1, resource_key_support=True))
    explanation = await store.explain(owner.namespace_id, ids[2])
    assert "RESOURCE_KEY_HELD" not in [r["code"] for r in explanation["reasons"]]
    (second,) = await store.claim(claim_request(owner, limit=1, resource_key_support=True))
    explanation = await store.explain(owner.namespace_id, ids[2])
    (held,) = [r for r in explanation["reasons"] if r["code"] == "RESOURCE_KEY_HELD"]
    assert held["message"] == "resource key 'k' has 2 of 2 running"
    assert (held["holder_task_id"], held["holder_task_ids"]) == (min(ids[:2]), sorted(ids[:2]))
    assert {first.task_id, second.task_id} == set(ids[:2])


async def test_holders_that_no_longer_hold_do_not_count(db):
    """Repair: a further-holder row left by a transition that did not delete it (a node
    of the version before 000028) counts only while its task is reserved or running."""
    owner = await tenant(db, max_running_per_key=2)
    done, *waiting = await insert_tasks(
        db, owner, [TaskSpec(available_in_s=-10 + i, resource_key="k") for i in range(3)]
    )

    async def leave_a_stale_row(tx):
        await tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id = %s", (done,))
        await tx.execute_raw(
            "INSERT INTO resource_key_holders (namespace_id, resource_key, task_id) VALUES (%s, 'k', %s)",
            (owner.namespace_id, done),
        )

    await db.transaction(leave_a_stale_row)
    taken = await lease_store(db).claim(claim_request(owner, resource_key_support=True))
    assert [r.task_id for r in taken] == waiting


async def test_the_sweeper_releases_a_further_holder(db):
    owner = await tenant(db, max_running_per_key=2)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, resource_key="k") for _ in range(2)])
    store = lease_store(db)
    taken = await store.claim(claim_request(owner, resource_key_support=True))
    assert len(taken) == 2 and await further_holders(db) == 1
    for r in taken:
        await expire_lease(db, r.task_id)
    await store.recover()
    assert await further_holders(db) == 0
    assert len(await store.claim(claim_request(owner, resource_key_support=True))) == 2
