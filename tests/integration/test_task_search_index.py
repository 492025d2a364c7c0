"""Task searches read about what they return: every page shape (no state, one or several
states, named task ids, after a cursor) is an index range in the page's order, whatever
else the namespace holds. Measured with MariaDB's Handler_read_* session counters around
one search (deterministic, not timed), as tests/integration/test_dispatch_index.py does for claims."""

from __future__ import annotations

import pytest

from orbit_node.db import Database
from orbit_node.domain.task_query import TaskFilter
from orbit_node.store.tasks import TaskStore

from ..seed import TaskSpec, bulk_insert_tasks, insert_tasks, tenant
from .test_dispatch_index import session_reads

MANY = 20_000
PAGE = 50
# What one page of PAGE may read in all: the namespace's application (one row), the page
# and one more row per state branch (index entry and row each), and the union's temporary
# table. Independent of MANY.
READ_BOUND = 6 * PAGE + 20


async def measured_search(dsn, namespace_id: str, found: TaskFilter, **kwargs):
    one = Database(dsn, size=1)
    try:
        store = TaskStore(one)
        # Every index entry visited is counted (no filtering inside the engine).
        await one.run(lambda tx: tx.execute_raw("SET SESSION optimizer_switch = 'index_condition_pushdown=off'"))
        before = await one.run(session_reads)
        baseline = await one.run(session_reads) - before
        page = await store.search(namespace_id, found, limit=PAGE, **kwargs)
        after = await one.run(session_reads)
    finally:
        await one.aclose()
    return page, after - before - 2 * baseline


@pytest.fixture
async def history(db):
    """MANY succeeded tasks of the namespace, then 10 failed and PAGE + 10 queued ones."""
    owner = await tenant(db)
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000dddd")
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'succeeded', finished_at = NOW(6)"))
    failed = await insert_tasks(db, owner, [TaskSpec() for _ in range(10)])
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'failed' WHERE task_id IN %s", (tuple(failed),)))
    queued = await insert_tasks(db, owner, [TaskSpec() for _ in range(PAGE + 10)])
    await db.run(lambda tx: tx.execute_raw("ANALYZE TABLE tasks"))
    return owner, failed, queued


async def test_a_page_without_a_state_reads_the_page(dsn, history):
    owner, _, queued = history
    page, reads = await measured_search(dsn, owner.namespace_id, TaskFilter())
    assert len(page.tasks) == PAGE and page.next_cursor is not None
    assert reads <= READ_BOUND, reads
    # The next page starts after the cursor, also without reading what came before.
    rest, reads = await measured_search(dsn, owner.namespace_id, TaskFilter(), after=page.next_cursor)
    assert len(rest.tasks) == PAGE and {t.task_id for t in rest.tasks}.isdisjoint(t.task_id for t in page.tasks)
    assert reads <= READ_BOUND, reads


@pytest.mark.parametrize("states", [("failed",), ("failed", "queued"), ("cancelled", "failed", "expired")])
async def test_a_page_of_rare_states_never_reads_the_history(dsn, history, states):
    owner, failed, queued = history
    page, reads = await measured_search(dsn, owner.namespace_id, TaskFilter(states=states))
    expected = sorted(failed + (queued if "queued" in states else []), reverse=True)[:PAGE]
    assert {t.task_id for t in page.tasks} == set(expected)
    assert reads <= READ_BOUND, (states, reads)


async def test_named_task_ids_are_read_by_primary_key(dsn, history):
    owner, failed, queued = history
    wanted = (*failed[:3], *queued[:3], "0000dddd" + "0" * 24)
    page, reads = await measured_search(dsn, owner.namespace_id, TaskFilter(task_ids=wanted, states=("failed",)))
    assert {t.task_id for t in page.tasks} == set(failed[:3])
    assert reads <= 4 * len(wanted) + 10, reads
