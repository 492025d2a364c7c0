"""The claim ordering query reads the dispatch index in order: no filesort."""

from __future__ import annotations

import json

from orbit_node.db.queries import QUERIES


async def test_claim_candidates_uses_dispatch_index_without_filesort(db):
    params = {
        "queue_id": "q" * 32,
        "capabilities": (("h", "v1", "v1"), ("g", "v2", "v1")),
        "resource_keys": 1,
        "limit": 16,
    }

    async def explain(tx):
        cursor_sql = "EXPLAIN FORMAT=JSON " + QUERIES["claim_candidates"]
        return await tx.fetchall_raw(cursor_sql, params)

    rows = await db.run(explain)
    plan = json.loads(next(iter(rows[0].values())))
    text = json.dumps(plan)
    assert '"key": "ix_tasks_dispatch"' in text
    assert "filesort" not in text
