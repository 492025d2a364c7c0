"""Cancel or retry every task a filter matches, from the task list: a confirmation page
that counts them, then the action on exactly what was counted.

The confirmation (``GET /console/tasks/bulk/{cancel|retry}`` with the list's filter)
searches as the action will (``TaskStore.bulk``: the states the action can change unless
the filter names states, the queues the credential's grant of the action's scope covers)
and shows how many tasks match, up to the API's bound of one call (1,000), with the
newest of them. Its form carries the filter bounded to the tasks counted: no newer than
the newest counted (``created_before``), at most as many as counted (``limit``). So a
task accepted meanwhile is not taken, and a task that changed state meanwhile is left
out, or counted as unchanged or refused, as the API's bulk action would. When more match
than one call takes, the answer offers to go on from where it stopped (the cursor).
"""

from __future__ import annotations

from datetime import timedelta

import attrs
from quart import request

from orbit_protocol.limits import MAX_BULK

from ...domain.errors import InvalidArgument, PermissionDenied
from ...domain.task_query import TaskFilter
from ...store import audit as actions
from ...store.audit import Entry
from .actions import ACTION_FIELDS, action_form, answer
from .answers import COUNT_PARAMS, DONE_PARAM
from .task_filters import FIELDS, Query, filter_json, filter_params, query_of
from .tasks_view import BULK_SCOPES, CHANGES, url
from .views import blueprint, page, principal, queue_names, shard

AUDITED = {"cancel": actions.TASKS_BULK_CANCEL, "retry": actions.TASKS_BULK_RETRY}
# The fields of the confirmation's form: the filter, where to start, how many, and the form's own.
FORM_FIELDS = ACTION_FIELDS | {*FIELDS, "cursor", "limit"}
# Tasks of the count the confirmation lists by id.
SHOWN = 10


async def checked(action: str, query: Query) -> TaskFilter:
    """The filter of a bulk ``action``, as the credential may use it: a filter (not an id's
    beginning) that names something, within the action's scope; the states it takes (the
    ones the action changes, as TaskStore.bulk, unless the filter names states or ids)."""
    who = principal()
    scope = BULK_SCOPES[action]
    if not who.scopes.get(scope):
        raise PermissionDenied(f"authorization: credential lacks scope {scope}", field="authorization")
    if query.prefix:
        raise InvalidArgument("task_id: a bulk action takes the filters, not an id's beginning", field="task_id")
    if query.filter.is_empty:
        raise InvalidArgument(
            "filter: name at least one filter (an empty filter would take every task)", field="filter"
        )
    if query.filter.queue_id is not None:
        who.require(scope, query.filter.queue_id)
        await shard().tenancy.get_queue(who.namespace_id, query.filter.queue_id)
    found = query.filter
    return found if found.task_ids else found.with_states(CHANGES[action])


@blueprint.get("/tasks/bulk/<any(cancel, retry):action>")
async def confirm_bulk(action: str):
    who = principal()
    title = f"{action.capitalize()} the tasks that match"
    query = query_of(request.args.to_dict(flat=False))
    found = await checked(action, query)
    counted = await shard().tasks.search(
        who.namespace_id,
        found,
        queue_ids=who.queue_filter(BULK_SCOPES[action]),
        after=query.cursor,
        limit=MAX_BULK,
    )
    already = 0
    if action == "retry":
        # A task retried before is not retried again: counted apart, never offered.
        notes = await shard().tasks.finish_notes(who.namespace_id, counted.tasks)
        already = sum(1 for note in notes.values() if note["retried_by"])
    bounded = found
    if counted.tasks:
        newest = counted.tasks[0].created_at + timedelta(microseconds=1)
        bounded = attrs.evolve(found, created_before=min(newest, found.created_before or newest))
    return await page(
        title,
        "console/panels/bulk.html",
        # What it counted stays as counted: the form acts on that.
        refresh=False,
        action=action,
        count=len(counted.tasks),
        already=already,
        more=counted.next_cursor is not None,
        shown=counted.tasks[:SHOWN],
        queue_names=await queue_names(),
        grant=who.queue_filter(BULK_SCOPES[action]),
        fields=filter_params(bounded),
        cursor=None if query.cursor is None else query.cursor.encode(),
        back=url("/console/tasks", filter_params(query.filter)),
        filter_text=filter_json(found),
    )


@blueprint.post("/tasks/bulk/<any(cancel, retry):action>")
async def run_bulk(action: str):
    form = await action_form("/console/tasks", FORM_FIELDS)
    who = principal()
    limit_text = (form.get("limit") or [""])[0]
    if not limit_text.isdecimal() or not 1 <= int(limit_text) <= MAX_BULK:
        raise InvalidArgument(f"limit: an integer from 1 to {MAX_BULK}", field="limit")
    query = query_of(form)
    found = await checked(action, query)
    where = shard()
    result = await where.tasks.bulk(
        action,
        who.namespace_id,
        found,
        queue_ids=who.queue_filter(BULK_SCOPES[action]),
        after=query.cursor,
        limit=int(limit_text),
    )
    where.after_bulk(result)
    counts = {"changed": result.changed, "unchanged": result.unchanged, "refused": result.refused}
    entry = Entry(
        who=who,
        action=AUDITED[action],
        queue_id=found.queue_id,
        filter={**filter_json(found), **({"cursor": query.cursor.encode()} if query.cursor else {})},
        changed=result.changed,
        outcome=", ".join(f"{n} {name}" for name, n in counts.items()),
    )
    params = [(DONE_PARAM, f"bulk-{action}"), *((name, str(counts[name])) for name in COUNT_PARAMS)]
    if result.next_cursor is not None:
        params += [("more", action), ("more_cursor", result.next_cursor.encode())]
    return await answer(entry, params)
