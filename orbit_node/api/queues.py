"""Routes of /v1/queues: create, get, list, pause, resume, controls."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ..domain import rules
from ..domain.wire import rfc3339
from ..store.tenancy import Queue
from . import envelope, validation
from .auth import principal, readable_queues, require_all_queues, require_queue_read, shard

bp = Blueprint("queues", __name__)

LIST_PARAMS = ("limit", "cursor")
# Cursor kind of queue listings (a task cursor is refused here).
CURSOR_KIND = "q1"


def queue_json(queue: Queue) -> dict[str, Any]:
    return {
        "queue_id": queue.queue_id,
        "name": queue.name,
        "paused": queue.paused,
        "max_concurrency": queue.max_concurrency,
        "max_starts_per_second": queue.max_starts_per_second,
        "max_running_per_key": queue.max_running_per_key,
        "created_at": rfc3339(queue.created_at),
    }


@bp.post("/queues")
async def create_queue():
    # A new queue is in no queue list, so creating one needs the scope for all queues.
    who = require_all_queues("queues:manage")
    fields = rules.create_queue(await validation.json_object(required=True))
    queue, _ = await shard().tenancy.create_queue(
        who.namespace_id,
        who.application_id,
        fields["name"],
        max_concurrency=fields["max_concurrency"],
        max_starts_per_second=fields["max_starts_per_second"],
        max_running_per_key=fields["max_running_per_key"],
    )
    return envelope.ok(queue_json(queue), 201)


@bp.get("/queues/<queue_id>")
async def get_queue(queue_id: str):
    who = require_queue_read(rules.path_id(queue_id, "queue_id"))
    return envelope.ok(queue_json(await shard().tenancy.get_queue(who.namespace_id, queue_id)))


@bp.get("/queues")
async def list_queues():
    queue_ids = readable_queues()
    params = validation.query(LIST_PARAMS)
    after = validation.decode_cursor(CURSOR_KIND, params)
    limit = validation.limit(params)
    queues = await shard().tenancy.list_queues(
        principal().namespace_id, after=after or "", limit=limit + 1, queue_ids=queue_ids
    )
    last = queues[limit - 1].queue_id if len(queues) > limit else None
    return envelope.ok([queue_json(q) for q in queues[:limit]], next_cursor=validation.encode_cursor(CURSOR_KIND, last))


def _manage(queue_id: str) -> str:
    """Check the path id and queues:manage for it; returns the namespace."""
    who = principal()
    who.require("queues:manage", rules.path_id(queue_id, "queue_id"))
    return who.namespace_id


@bp.post("/queues/<queue_id>/pause")
async def pause_queue(queue_id: str):
    namespace_id = _manage(queue_id)
    rules.no_fields(await validation.json_object(required=False))
    return envelope.ok(queue_json(await shard().set_queue_paused(namespace_id, queue_id, True)))


@bp.post("/queues/<queue_id>/resume")
async def resume_queue(queue_id: str):
    namespace_id = _manage(queue_id)
    rules.no_fields(await validation.json_object(required=False))
    where = shard()
    # Claims that found the queue paused try again now, on every node, instead of when
    # their empty-result cache entry expires.
    queue = await where.set_queue_paused(namespace_id, queue_id, False)
    return envelope.ok(queue_json(queue))


@bp.patch("/queues/<queue_id>/controls")
async def set_queue_controls(queue_id: str):
    namespace_id = _manage(queue_id)
    changes = rules.queue_controls(await validation.json_object(required=True))
    return envelope.ok(queue_json(await shard().update_queue_controls(namespace_id, queue_id, changes)))
