"""Finding tasks by filter, a page at a time, and why queued ones wait.

One search serves ``GET /v1/tasks``, the bulk actions (``store/actions.py``), ``orbit-admin
task list`` and the console: summaries newest first by ``(created_at, task_id)`` after a
``TaskCursor``. SQL in ``db/sql/tasks.sql`` (``task_search*``): every shape is an index
range in the page's order (``docs/api.md``, "Listing"), so a page reads about what it
returns unless the filter's other conditions skip many rows of that range.

``waiting_reasons`` says, for the queued tasks of a page, the first thing that holds each
back, from the same checks ``GET /v1/tasks/{id}/explain`` makes (``store/explain.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.task_query import TaskCursor, TaskFilter
from .explain import (
    capable_connections,
    gate_reasons,
    held_keys,
    key_full,
    live_connections,
    queue_gates,
    quota_reasons,
)
from .task_rows import TaskSummary

# A listing's waiting_reason: the first of these that holds a queued task back (the most
# an operator can act on first). QUOTA stands for the application's quota and the queue's
# controls (concurrency, start rate). GET /v1/tasks/{id}/explain gives every reason.
WAITING_ORDER = ("QUEUE_PAUSED", "APPLICATION_SUSPENDED", "NO_CAPABLE_WORKER", "NOT_DUE", "QUOTA", "RESOURCE_KEY_HELD")
QUOTA_CODES = frozenset(
    {
        "APPLICATION_CONCURRENCY_FULL",
        "APPLICATION_START_RATE_EXHAUSTED",
        "QUEUE_CONCURRENCY_FULL",
        "QUEUE_START_RATE_EXHAUSTED",
    }
)


@attrs.frozen
class TaskSearchPage:
    """One page of a search, newest first."""

    tasks: list[TaskSummary]
    # Where the next page starts (pass it as ``after``); None when this page is the last.
    next_cursor: TaskCursor | None


def _params(
    namespace_id: str, found: TaskFilter, queue_ids: Sequence[str] | None, after: TaskCursor | None, limit: int
) -> dict[str, Any]:
    return {
        "namespace_id": namespace_id,
        "after_at": None if after is None else after.created_at,
        "after_id": None if after is None else after.task_id,
        "queue_id": found.queue_id,
        "all_queues": queue_ids is None,
        # IN () is not valid SQL; the flags make these placeholder lists irrelevant.
        "queue_ids": ("",) if queue_ids is None else tuple(queue_ids),
        "handler": found.handler,
        "any_priority": found.priorities is None,
        "priorities": found.priorities or (-1,),
        "created_after": found.created_after,
        "created_before": found.created_before,
        "finished_after": found.finished_after,
        "finished_before": found.finished_before,
        "limit": limit + 1,
    }


async def search_tasks(
    db: Database,
    namespace_id: str,
    application_id: str,
    found: TaskFilter,
    *,
    queue_ids: Sequence[str] | None,
    after: TaskCursor | None,
    limit: int,
) -> TaskSearchPage:
    """Up to ``limit`` summaries of the namespace's tasks that ``found`` matches, newest first
    after ``after``. ``queue_ids`` None means every queue of the namespace (else only these)."""
    if found.matches_nothing or (queue_ids is not None and not queue_ids):
        return TaskSearchPage([], None)
    params = _params(namespace_id, found, queue_ids, after, limit)
    if found.task_ids:
        params.update(task_ids=found.task_ids, any_state=not found.states, states=found.states or ("",))
        rows = await db.fetchall("task_search_ids", params)
    elif found.states:
        params["application_id"] = application_id
        branches = [{"state": state} for state in found.states]

        async def union(tx: Tx) -> list[dict[str, Any]]:
            return await tx.fetchall_union("task_search_branch", "task_search_order", branches, params)

        rows = await db.run(union)
    else:
        rows = await db.fetchall("task_search", params)
    tasks = [TaskSummary.from_row(r) for r in rows[:limit]]
    last = tasks[-1] if len(rows) > limit else None
    return TaskSearchPage(tasks, None if last is None else TaskCursor(last.created_at, last.task_id))


def first_reason(codes: Sequence[str]) -> str | None:
    """The waiting reason a listing shows of a task's reason codes (``WAITING_ORDER``)."""
    named = {"QUOTA" if code in QUOTA_CODES else code for code in codes}
    return next((code for code in WAITING_ORDER if code in named), None)


async def waiting_reasons(db: Database, namespace_id: str, tasks: Sequence[TaskSummary]) -> dict[str, str]:
    """task id -> why that queued task waits (``WAITING_ORDER``), for the queued tasks of
    ``tasks`` that something holds back; one consistent snapshot, a few reads a page."""
    queued = [t for t in tasks if t.state == "queued"]
    if not queued:
        return {}

    async def body(tx: Tx) -> dict[str, str]:
        gates = {g["queue_id"]: g for g in await queue_gates(tx, namespace_id, sorted({t.queue_id for t in queued}))}
        quotas: dict[str, list[str]] = {}
        for queue_id, queue in gates.items():
            quotas[queue_id] = [r["code"] for r in await quota_reasons(tx, queue)]
        held = await held_keys(tx, namespace_id, [t.resource_key for t in queued if t.resource_key is not None])
        connections = await live_connections(tx, namespace_id)
        reasons: dict[str, str] = {}
        for task in queued:
            gate = gates.get(task.queue_id)
            if gate is None:
                continue
            row: Mapping[str, Any] = {**gate, **attrs.asdict(task)}
            codes = [r["code"] for r in gate_reasons(row)] + quotas[task.queue_id]
            if capable_connections(connections, row) == 0:
                codes.append("NO_CAPABLE_WORKER")
            if task.resource_key in held and key_full(gate, held[task.resource_key]):
                codes.append("RESOURCE_KEY_HELD")
            reason = first_reason(codes)
            if reason is not None:
                reasons[task.task_id] = reason
        return reasons

    return await db.transaction(body, isolation="REPEATABLE READ")
