"""Routes that act on tasks already accepted: retry one, and cancel or retry many by filter.

``POST /v1/tasks/{task_id}/retry`` (``tasks:submit`` for the task's queue): a failed,
cancelled or expired task gets a new task linked to it (``retried_from``), 201; retrying
it again answers that same task, 200. ``POST /v1/tasks/bulk-cancel`` (``tasks:cancel``)
and ``/bulk-retry`` (``tasks:submit``) take ``{"filter": {...}, "limit": N, "cursor": ...}``
and change at most ``limit`` (1,000) tasks of the queues the credential's grant covers,
newest first; ``next_cursor`` goes on, null when no more match (``docs/api.md``).
"""

from __future__ import annotations

from quart import Blueprint

from ..domain import rules
from ..domain.task_query import bulk_request
from ..services import Shard
from ..store.actions import BulkOutcome
from . import envelope, validation
from .auth import require_any, shard
from .tasks import check_queue_filter, cursor_text, task_json

bp = Blueprint("task_actions", __name__)


@bp.post("/tasks/<task_id>/retry")
async def retry_task(task_id: str):
    who = require_any("tasks:submit")
    rules.path_id(task_id, "task_id")
    rules.no_fields(await validation.json_object(required=False))
    where = shard()
    task = await where.tasks.get(who.namespace_id, task_id)
    who.require("tasks:submit", task.queue_id)
    retried = await where.retry_task(who.namespace_id, task_id)
    return envelope.ok(task_json(retried.task), 201 if retried.created else 200)


def bulk_answer(result: BulkOutcome):
    return envelope.ok(
        {
            "changed": result.changed,
            "unchanged": result.unchanged,
            "refused": result.refused,
            "results": [o.as_json() for o in result.outcomes],
        },
        next_cursor=cursor_text(result.next_cursor),
    )


async def run_bulk(action: str, scope: str) -> tuple[Shard, BulkOutcome]:
    """A bulk ``action`` for a credential with ``scope``, on the queues its grant covers."""
    who = require_any(scope)
    asked = bulk_request(await validation.json_object(required=True))
    await check_queue_filter(who, asked.filter.queue_id, scope)
    where = shard()
    result = await where.tasks.bulk(
        action, who.namespace_id, asked.filter, queue_ids=who.queue_filter(scope), after=asked.after, limit=asked.limit
    )
    return where, result


@bp.post("/tasks/bulk-cancel")
async def bulk_cancel():
    where, result = await run_bulk("cancel", "tasks:cancel")
    where.after_bulk(result)
    return bulk_answer(result)


@bp.post("/tasks/bulk-retry")
async def bulk_retry():
    where, result = await run_bulk("retry", "tasks:submit")
    where.after_bulk(result)
    return bulk_answer(result)
