"""Claims in strict order: whatever rows anyone holds locked, a claim takes exactly the
first free eligible rows in (dispatch_at, available_at, task_id) order."""

from __future__ import annotations

import random

import trio

from orbit_node.db import Database
from orbit_node.domain.ownership import FinishItem

from ..seed import TaskSpec, claim_request, insert_tasks, lease_store, task_row, tenant


class RowLocks:
    """Another database session holding ``SELECT ... FOR UPDATE`` on chosen task rows
    (an operator's query, a cancel, a claim on another node) until released."""

    def __init__(self, dsn):
        self.db = Database(dsn, size=1)
        self.held = trio.Event()
        self.release = trio.Event()

    async def hold(self, task_ids):
        async def body(tx):
            marks = ", ".join(["%s"] * len(task_ids))
            await tx.fetchall_raw(f"SELECT task_id FROM tasks WHERE task_id IN ({marks}) FOR UPDATE", tuple(task_ids))
            self.held.set()
            await self.release.wait()

        await self.db.transaction(body)


async def drain_one_at_a_time(store, owner, count):
    """A capacity-1 Worker: claim one, start it, finish it, ``count`` times."""
    seen = []
    for _ in range(count):
        (r,) = await store.claim(claim_request(owner, limit=1))
        seen.append(r.task_id)
        await store.start(r.task_id, r.fencing_token)
        await store.finish_many([FinishItem(r.task_id, r.fencing_token, "null")])
    return seen


async def test_a_locked_head_leaves_the_rest_in_order(db, dsn):
    owner = await tenant(db)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, task_id=f"{i:032x}") for i in range(1, 10)])
    store = lease_store(db)
    locks = RowLocks(dsn)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(locks.hold, ids[:1])
            await locks.held.wait()
            seen = await drain_one_at_a_time(store, owner, 8)
            locks.release.set()
    finally:
        await locks.db.aclose()
    assert seen == ids[1:]
    assert (await task_row(db, ids[0]))["state"] == "queued"


async def test_any_locked_rows_leave_exactly_the_first_free_ones_in_order(db, dsn):
    rng = random.Random(7)
    owner = await tenant(db)
    # Equal times and priorities: the order is task_id's; and a priority-3 task that is due.
    specs = [TaskSpec(available_in_s=-1, task_id=f"{i:032x}") for i in range(1, 41)]
    ids = await insert_tasks(db, owner, specs)
    store = lease_store(db, batch_size=64)
    for _ in range(3):
        queued = [i for i in ids if (await task_row(db, i))["state"] == "queued"]
        locked = sorted(rng.sample(queued, 6))
        locks = RowLocks(dsn)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(locks.hold, locked)
                await locks.held.wait()
                got = await store.claim(claim_request(owner, limit=5))
                locks.release.set()
        finally:
            await locks.db.aclose()
        free = [i for i in queued if i not in locked]
        assert [r.task_id for r in got] == free[:5]


async def test_four_nodes_claiming_one_queue_keep_ownership_single_and_order(db, dsn):
    owner = await tenant(db)
    count = 400
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, task_id=f"{i:032x}") for i in range(count)])
    position = {task_id: index for index, task_id in enumerate(ids)}
    nodes = [Database(dsn, size=2) for _ in range(4)]
    claims: list[list[str]] = []

    async def node_claimer(node_db, index):
        store = lease_store(node_db, batch_size=16)
        while True:
            got = await store.claim(claim_request(owner, limit=16, connection_id=f"conn-{index}"))
            if not got:
                return
            claims.append([r.task_id for r in got])
            await store.start_many([(r.task_id, r.fencing_token) for r in got])

    try:
        async with trio.open_nursery() as nursery:
            for index, node_db in enumerate(nodes):
                nursery.start_soon(node_claimer, node_db, index)
    finally:
        for node_db in nodes:
            await node_db.aclose()
    taken = [task_id for claim in claims for task_id in claim]
    assert sorted(taken) == sorted(ids)  # every task once: one owner each
    for claim in claims:
        # Inside one claim, the tasks are in order (all of them were free when it ran).
        assert [position[t] for t in claim] == sorted(position[t] for t in claim)
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT task_id, COUNT(*) AS n FROM task_attempts GROUP BY task_id HAVING n > 1")
    )
    assert rows == []
