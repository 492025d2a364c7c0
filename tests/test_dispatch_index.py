"""The claim statement reads the dispatch index in order (no filesort), on an empty table
as with 100,000 future-dated tasks in the queue, and then stops near the batch size."""

from __future__ import annotations

import json

from orbit_node.db.queries import QUERIES

from .seed import CAP, bulk_insert_tasks, claim_request, dispatch_store, tenant

FUTURE_TASKS = 100_000
DUE_TASKS = 40
BATCH = 16


async def handler_reads(tx) -> int:
    rows = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows)


async def test_claim_candidates_uses_dispatch_index_on_an_empty_table(db):
    """A new database (no rows, no statistics) plans the claim on the same index."""
    params = {
        "queue_id": "q" * 32,
        "capabilities": (("h", "v1", "v1"), ("g", "v2", "v1")),
        "resource_keys": 1,
        "limit": BATCH,
    }
    rows = await db.run(lambda tx: tx.fetchall_raw("EXPLAIN FORMAT=JSON " + QUERIES["claim_candidates"], params))
    text = json.dumps(json.loads(next(iter(rows[0].values()))))
    assert '"key": "ix_tasks_dispatch"' in text
    assert "filesort" not in text


async def test_claim_candidates_with_100k_future_tasks(db):
    owner = await tenant(db)
    # Future tasks of every priority: even level 9 (dispatch_at 270 s before available_at)
    # stays outside the "dispatch_at <= NOW(6)" range when due in an hour or more.
    await bulk_insert_tasks(db, owner, FUTURE_TASKS, id_prefix="ffffffff", available_in_s=3600, spread_s=0.01)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET priority = CONV(RIGHT(task_id, 1), 16, 10) % 10"))
    await bulk_insert_tasks(db, owner, DUE_TASKS, id_prefix="00000000", available_in_s=-60, spread_s=0.5)
    await db.run(lambda tx: tx.execute_raw("ANALYZE TABLE tasks"))
    params = {
        "queue_id": owner.queue_id,
        "capabilities": (CAP.as_tuple(), ("other", "v1", "v1")),
        "resource_keys": 1,
        "limit": BATCH,
    }

    async def measure(tx):
        plan = await tx.fetchall_raw("EXPLAIN FORMAT=JSON " + QUERIES["claim_candidates"], params)
        before = await handler_reads(tx)
        rows = await tx.fetchall("claim_candidates", params)
        after = await handler_reads(tx)
        return json.loads(next(iter(plan[0].values()))), rows, after - before

    plan, rows, examined = await db.run(measure)
    text = json.dumps(plan)
    assert '"key": "ix_tasks_dispatch"' in text
    assert "filesort" not in text
    table = plan["query_block"].get("table") or plan["query_block"]["nested_loop"][0]["table"]
    assert table["access_type"] == "range"
    # The optimizer's estimate: the due range, not the 100,000 future rows.
    assert table["rows"] <= 4 * DUE_TASKS
    # What the statement actually read (handler reads): the batch itself.
    assert len(rows) == BATCH
    assert examined <= BATCH + 1, examined
    assert [r["task_id"][:8] for r in rows] == ["00000000"] * BATCH

    # The whole claim takes the head of the due tasks in order.
    reservations = await dispatch_store(db, batch_size=BATCH).claim(claim_request(owner, limit=BATCH))
    assert [r.task_id for r in reservations] == [r["task_id"] for r in rows]
