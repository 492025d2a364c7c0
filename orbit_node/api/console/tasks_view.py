"""The console's task pages: the task list (search by id or its beginning, filters by
queue and state, paging past the newest), one task's story, and its stored values whole.

A task's page reads only the beginning of its payload, result and errors
(``store/console.py``) and shows it laid out (``values.py``), with a link to the route
that returns the value whole. The payload never changes, so it is on the page only, not
in the live panel its refresh fetches: a task with a 1 MB payload costs a refresh a few
KiB (and a ``304`` while nothing changes).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from quart import Response, request

from ...errors import InvalidArgument, NotFound
from ...ids import is_hex32
from ...store.tasks import LIST_START, STATES
from .values import ATTEMPT_PREVIEW_CHARS, ERROR_READ_CHARS, PREVIEW_CHARS, error_preview, preview
from .views import (
    RECENT_TASKS,
    SCOPE,
    blueprint,
    console_store,
    is_fragment,
    page,
    principal,
    queue_names,
    readable,
    see_other,
    shard,
)

HEX = frozenset("0123456789abcdef")
# The query parameters of the task list (any other is ignored, as a browser may add some).
LIST_FILTERS = ("task_id", "queue_id", "state", "before")


def hex_prefix(value: str) -> bool:
    return 0 < len(value) <= 32 and set(value) <= HEX


def list_query(args: Mapping[str, str], names: Mapping[str, str]) -> dict[str, str]:
    """The task list's filters from the query, checked; ``task_id`` may be an id's beginning.
    Empty values count as absent. ``names``: the queues the credential reads (id -> name)."""
    query = {name: args[name].strip().lower() for name in LIST_FILTERS if args.get(name, "").strip()}
    if "task_id" in query and not hex_prefix(query["task_id"]):
        raise InvalidArgument(
            "task_id: a task id is 32 hexadecimal digits; give all of them, or its first ones", field="task_id"
        )
    if "before" in query and not is_hex32(query["before"]):
        raise InvalidArgument("before: a task id (32 hexadecimal digits)", field="before")
    if "state" in query and query["state"] not in STATES:
        raise InvalidArgument(f"state: one of {', '.join(STATES)}", field="state")
    if "queue_id" in query and query["queue_id"] not in names:
        raise InvalidArgument("queue_id: not a queue you read in this namespace", field="queue_id")
    return query


@blueprint.get("/tasks")
async def tasks():
    who = principal()
    names = await queue_names()
    try:
        query = list_query(request.args, names)
    except InvalidArgument as exc:
        return await page(
            "Tasks",
            "console/panels/tasks.html",
            status=400,
            tasks=[],
            queue_names=names,
            query={},
            states=STATES,
            error=exc.message,
        )
    prefix = query.get("task_id", "")
    if len(prefix) == 32:
        return see_other(f"/console/tasks/{prefix}")
    # Ids sort by time: the newest id starting with the prefix is below prefix + "g".
    before = min(query.get("before", LIST_START), prefix + "g" if prefix else LIST_START)
    found = await shard().tasks.list(
        who.namespace_id,
        queue_ids=readable(),
        queue_id=query.get("queue_id"),
        state=query.get("state"),
        before=before,
        limit=RECENT_TASKS + 1,
    )
    # Newest first: the ids that start with the prefix come before every other.
    matching = [t for t in found.tasks if t.task_id.startswith(prefix)]
    shown = matching[:RECENT_TASKS]
    older = None
    if len(matching) > RECENT_TASKS:
        older = "/console/tasks?" + urllib.parse.urlencode({**query, "before": shown[-1].task_id})
    newest = None
    if "before" in query:
        newest = "/console/tasks?" + urllib.parse.urlencode({k: v for k, v in query.items() if k != "before"})
    return await page(
        "Tasks",
        "console/panels/tasks.html",
        live_query=query,
        tasks=shown,
        queue_names=names,
        query=query,
        states=STATES,
        older=older,
        newest=newest,
        error=None,
    )


@blueprint.get("/tasks/<task_id>")
async def task(task_id: str):
    who = principal()
    story = await console_store().task(
        who.namespace_id,
        task_id,
        with_payload=not is_fragment(),
        head_chars=PREVIEW_CHARS,
        error_chars=ERROR_READ_CHARS,
    )
    who.require(SCOPE, story["queue_id"])
    for name in ("payload", "result"):
        if story[name] is not None:
            story[name] = preview(story[name], PREVIEW_CHARS)
    if story["error"] is not None:
        story["error"] = error_preview(story["error"], PREVIEW_CHARS)
    for attempt in story["attempt_history"]:
        if attempt["error"] is not None:
            attempt["error"] = error_preview(attempt["error"], ATTEMPT_PREVIEW_CHARS)
    explanation = await shard().store.explain(who.namespace_id, task_id)
    return await page(
        f"Task {task_id}",
        "console/panels/task.html",
        static_panel="console/panels/task_payload.html",
        task=story,
        explanation=explanation,
        endpoint="console.tasks",
        cancellable=story["state"] in ("queued", "reserved", "running") and not story["cancel_requested"],
    )


def whole(queue_id: str, text: str | None, filename: str) -> Response:
    """A stored value whole, as stored (JSON text), for a credential that reads its queue."""
    principal().require(SCOPE, queue_id)
    if text is None:
        raise NotFound("value: not set", field="value")
    response = Response(text, 200, content_type="application/json; charset=utf-8")
    response.headers["Content-Disposition"] = f'inline; filename="{filename}"'
    return response


@blueprint.get("/tasks/<task_id>/<any(payload, result, error):name>")
async def task_value(task_id: str, name: str):
    queue_id, text = await console_store().value(principal().namespace_id, task_id, name)
    return whole(queue_id, text, f"{task_id}-{name}.json")


@blueprint.get("/tasks/<task_id>/attempts/<int:attempt_id>/error")
async def attempt_error(task_id: str, attempt_id: int):
    queue_id, text = await console_store().attempt_error(principal().namespace_id, task_id, attempt_id)
    return whole(queue_id, text, f"{task_id}-attempt-{attempt_id}-error.json")
