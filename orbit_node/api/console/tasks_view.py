"""The console's task pages: the task list and the failed tasks (search by id or its
beginning, the API's filters, paging past the newest, links to the bulk actions), one
task's story, and its stored values whole.

A task's page reads only the beginning of its payload, result and errors
(``store/console.py``) and shows it laid out (``values.py``), with a link to the route
that returns the value whole. The payload never changes, so it is on the page only, not
in the live panel its refresh fetches: a task with a 1 MB payload costs a refresh a few
KiB (and a ``304`` while nothing changes).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

from quart import Response, request

from ...domain.errors import InvalidArgument, NotFound
from ...domain.task_query import CANCELLABLE_STATES, PRIORITIES, RETRYABLE_STATES, STATES, TaskFilter
from . import model
from .family import family_graph
from .task_filters import Query, filter_params, query_of, query_params
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

# The task list's panel (the task list and the failed tasks).
PANEL = "console/panels/tasks.html"
# Which bulk action a credential may ask for, with which scope (as the API's routes).
BULK_SCOPES = {"cancel": "tasks:cancel", "retry": "tasks:submit"}
# The states in which each action changes a task.
CHANGES = {"cancel": CANCELLABLE_STATES, "retry": RETRYABLE_STATES}


def url(path: str, params: Sequence[tuple[str, str]]) -> str:
    return path + ("?" + urllib.parse.urlencode(params) if params else "")


# Children a task page lists at most (the API pages through all of them).
FAMILY_CHILDREN = 100


@blueprint.get("/tasks")
async def tasks():
    return await task_list("Tasks")


@blueprint.get("/failed")
async def failed():
    """The failed tasks, newest first, with the filters and actions of the task list."""
    return await task_list("Failed tasks", defaults={"state": ["failed"]})


async def task_list(title: str, *, defaults: dict[str, list[str]] | None = None) -> Response:
    who = principal()
    names = await queue_names()
    context: dict[str, Any] = {
        "queue_names": names,
        "states": STATES,
        "levels": PRIORITIES,
        "waiting": {},
        "notes": {},
        "times": {},
    }
    try:
        query = query_of(request.args.to_dict(flat=False), defaults=defaults)
        if query.filter.queue_id is not None and query.filter.queue_id not in names:
            raise InvalidArgument("queue_id: not a queue you read in this namespace", field="queue_id")
    except InvalidArgument as exc:
        return await page(title, PANEL, status=400, tasks=[], query=Query(TaskFilter()), error=exc.message, **context)
    if len(query.prefix) == 32:
        return see_other(f"/console/tasks/{query.prefix}")
    if query.prefix:
        found = await console_store().search_prefix(
            who.namespace_id, query.prefix, query.filter, queue_ids=readable(), after=query.cursor, limit=RECENT_TASKS
        )
    else:
        found = await shard().tasks.search(
            who.namespace_id, query.filter, queue_ids=readable(), after=query.cursor, limit=RECENT_TASKS
        )
    here = request.path
    context["waiting"] = await shard().tasks.waiting_reasons(who.namespace_id, found.tasks)
    # A finished task: what broke (its error's code and message) and what retried it.
    context["notes"] = await shard().tasks.finish_notes(who.namespace_id, found.tasks)
    context["times"] = model.filter_times(query.filter)
    older = url(here, query_params(query, cursor=found.next_cursor)) if found.next_cursor else None
    newest = url(here, query_params(query)) if query.cursor else None
    # Bulk actions take the filter (not an id's beginning), one that names something, and
    # are offered when the filter's states leave something they can change.
    bulk = {}
    if not query.prefix and not query.filter.is_empty:
        bulk = {
            action: url(f"/console/tasks/bulk/{action}", filter_params(query.filter))
            for action, scope in BULK_SCOPES.items()
            if who.scopes.get(scope) and (not query.filter.states or set(query.filter.states) & set(CHANGES[action]))
        }
    go_on = None
    if request.args.get("more") in BULK_SCOPES and request.args.get("more_cursor"):
        params = [*filter_params(query.filter), ("cursor", request.args["more_cursor"])]
        go_on = url(f"/console/tasks/bulk/{request.args['more']}", params)
    return await page(
        title,
        PANEL,
        live_query=query_params(query, cursor=query.cursor),
        tasks=found.tasks,
        query=query,
        older=older,
        newest=newest,
        bulk=bulk,
        go_on=go_on,
        back=url(here, query_params(query)),
        error=None,
        **context,
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
    explanation = await shard().leases.explain(who.namespace_id, task_id)
    tasks = shard().tasks
    parents = await tasks.parents(task_id)
    found = await tasks.children(task_id, limit=FAMILY_CHILDREN + 1)
    children = found[:FAMILY_CHILDREN]
    more_children = len(found) > FAMILY_CHILDREN
    return await page(
        f"Task {task_id}",
        "console/panels/task.html",
        static_panel="console/panels/task_payload.html",
        task=story,
        explanation=explanation,
        parents=parents,
        children=children,
        more_children=more_children,
        family=family_graph(story, parents, children),
        endpoint="console.tasks",
        cancellable=story["state"] in CANCELLABLE_STATES and not story["cancel_requested"],
        retryable=story["state"] in RETRYABLE_STATES and story["retried_by"] is None,
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
