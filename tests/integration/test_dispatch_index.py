"""Bounded claims: the candidate read goes through ix_tasks_claim, one ordered range per
(capability, keyed, priority level), and one claim reads about what it takes, whatever
else the queue holds. Measured with MariaDB's Handler_read_* session counters around
one whole claim transaction (deterministic, not timed)."""

from __future__ import annotations

import json

import pytest

from orbit_node.db import Database
from orbit_node.db.queries import QUERIES
from orbit_node.domain.claims import Capability

from ..seed import CAP, TaskSpec, bulk_insert_tasks, claim_request, insert_tasks, lease_store, tenant

MANY = 20_000
BATCH = 16
# What one claim of BATCH may read in all (measured on MariaDB 10.11: 149 for the plain
# shape, 181 for the others): its candidates (the batch plus one index dive per branch:
# 10 priority levels), the rows it locks, reserves and copies into attempts, the gates,
# and per locked row the primary-key probes of its trace context (000026) and its parents
# (000027, about 2 reads a row). Independent of MANY: a claim that read the queue would
# read thousands.
READ_BOUND = 12 * BATCH


async def session_reads(tx) -> int:
    """Index and row reads of this session (Handler_read_rnd_next, which reading the
    status itself drives, left out)."""
    rows = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows if r["Variable_name"] != "Handler_read_rnd_next")


async def measured_claim(dsn, owner, *, resource_key_support=False):
    """One claim on a one-connection pool: (reservations, handler reads of the claim)."""
    one = Database(dsn, size=1)
    try:
        store = lease_store(one, batch_size=BATCH)
        # Index condition pushdown filters rows inside the engine, out of the counters'
        # sight: off for the measured session, so every index entry visited is counted.
        await one.run(lambda tx: tx.execute_raw("SET SESSION optimizer_switch = 'index_condition_pushdown=off'"))
        before = await one.run(session_reads)
        baseline = await one.run(session_reads) - before  # what reading the counters costs
        reservations = await store.claim(claim_request(owner, limit=BATCH, resource_key_support=resource_key_support))
        after = await one.run(session_reads)
    finally:
        await one.aclose()
    return reservations, after - before - 2 * baseline


def branch_sql() -> str:
    return QUERIES["claim_candidates_branch"].replace("{i}", "0") + " " + QUERIES["claim_candidates_order"]


async def test_a_candidate_branch_is_an_ordered_range_of_the_claim_index_on_an_empty_table(db):
    """A new database (no rows, no statistics) plans a branch on ix_tasks_claim."""
    params = {
        "queue_id": "q" * 32,
        "limit": BATCH,
        "handler_0": "h",
        "handler_version_0": "v1",
        "payload_version_0": "v1",
        "keyed_0": 0,
        "priority_0": 3,
        "window_s_0": 90,
    }
    rows = await db.run(lambda tx: tx.fetchall_raw("EXPLAIN FORMAT=JSON " + branch_sql(), params))
    text = json.dumps(json.loads(next(iter(rows[0].values()))))
    assert '"key": "ix_tasks_claim"' in text
    assert '"access_type": "range"' in text


async def due_mine(db, owner, count=BATCH + 4):
    """The connection's own due tasks, behind whatever the shape put ahead of them."""
    return await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(count)])


async def plain(db, owner):
    return await due_mine(db, owner)


async def future_tasks(db, owner):
    await bulk_insert_tasks(db, owner, MANY, id_prefix="ffffffff", available_in_s=3600, spread_s=0.01)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET priority = CONV(RIGHT(task_id, 1), 16, 10) % 10"))
    return await due_mine(db, owner)


async def other_handler_ahead(db, owner):
    # Due long before the connection's own tasks, but of a handler it cannot run.
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000aaaa", available_in_s=-600, handler="other")
    return await due_mine(db, owner)


async def inside_priority_window(db, owner):
    # Priority 9, available within the next 270 s: dispatch_at has passed, available_at not.
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000bbbb", available_in_s=100, spread_s=0.005, priority=9)
    return await due_mine(db, owner)


async def keyed_ahead_without_key_support(db, owner):
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000cccc", available_in_s=-600)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET resource_key = task_id WHERE task_id LIKE '0000cccc%%'"))
    return await due_mine(db, owner)


async def finished_history(db, owner):
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000dddd", available_in_s=-600)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id LIKE '0000dddd%%'"))
    return await due_mine(db, owner)


@pytest.mark.parametrize(
    "shape",
    [
        plain,
        future_tasks,
        other_handler_ahead,
        inside_priority_window,
        keyed_ahead_without_key_support,
        finished_history,
    ],
)
async def test_one_claim_reads_a_bounded_number_of_rows_whatever_the_queue_holds(db, dsn, shape):
    owner = await tenant(db)
    mine = await shape(db, owner)
    await db.run(lambda tx: tx.execute_raw("ANALYZE TABLE tasks"))
    reservations, reads = await measured_claim(dsn, owner)
    # It takes the head of its own due tasks, in order.
    assert [r.task_id for r in reservations] == sorted(mine)[:BATCH]
    assert reads <= READ_BOUND, (shape.__name__, reads)


async def test_two_capabilities_and_resource_keys_merge_in_dispatch_order(db, dsn):
    owner = await tenant(db)
    specs = []
    for i in range(12):
        handler = "h" if i % 2 else "g"
        specs.append(
            TaskSpec(
                handler=handler, available_in_s=-100 + i, priority=i % 3, resource_key=f"k{i}" if i % 4 == 0 else None
            )
        )
    ids = await insert_tasks(db, owner, specs)
    # The order P3 defines: dispatch_at = available_at - 30 s x priority, then available_at, task_id.
    order = sorted(range(12), key=lambda i: (-100 + i - 30 * (i % 3), -100 + i, ids[i]))
    store = lease_store(db, batch_size=BATCH)
    got = await store.claim(
        claim_request(owner, limit=12, capabilities=(CAP, Capability("g", "v1", "v1")), resource_key_support=True)
    )
    assert [r.task_id for r in got] == [ids[i] for i in order]
