"""The console's writes and their audit: cancel a task, pause or resume a queue, and the
audit page that lists who did what.

A write is a form post of a console page. ``views.authenticate`` has checked it already
(a signed-in session, this console's origin, the session's form token); here the
credential's scopes decide, as in the API: ``tasks:cancel`` for the task's queue,
``queues:manage`` for the queue. The store does what the API's routes do (the same
methods, the same signals to the Workers), then the action is recorded
(``store/audit.py``) and the browser is sent back to the page it came from with a word
saying what was done (``views.DONE``).
"""

from __future__ import annotations

import logging
import urllib.parse

from quart import Response, g, request

from ...errors import InvalidArgument, OrbitError
from ...store import audit as actions
from ...store.audit import AuditStore, Entry
from ...store.tasks import Task
from .views import (
    DONE_PARAM,
    FORM_TOKEN,
    UNRECORDED_PARAM,
    blueprint,
    next_path,
    page,
    principal,
    readable,
    see_other,
    shard,
)

log = logging.getLogger("orbit.console")

# The fields of an action's form: the form token, and the console page to return to.
ACTION_FIELDS = frozenset({FORM_TOKEN, "back"})
# Records on one page of the audit.
AUDIT_PAGE = 50


def audit_store() -> AuditStore:
    return AuditStore(shard().db)


async def action_form(default_back: str) -> str:
    """The console page to return to after the action (checked: a console path only)."""
    form = await request.form
    unknown = sorted(set(form) - ACTION_FIELDS)
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: not a field of this form", field=unknown[0])
    g.console_back = next_path(form.get("back") or default_back)
    return g.console_back


async def answer(back: str, entry: Entry, done: str) -> Response:
    """Record the action, then send the browser back with what was done."""
    query = {DONE_PARAM: done}
    try:
        await audit_store().record(entry)
    except OrbitError as exc:
        # Done but not recorded: said on the page, and here.
        log.error(
            "console %s by credential %s done, its audit record not written: %s",
            entry.action,
            entry.who.credential_id,
            exc.code,
        )
        query[UNRECORDED_PARAM] = "1"
    log.info("console %s by credential %s: %s", entry.action, entry.who.credential_id, entry.outcome)
    return see_other(back + "?" + urllib.parse.urlencode(query))


def cancel_outcome(before: Task, after: Task) -> tuple[str, int]:
    """The ``views.DONE`` word of a cancel, and how many tasks it changed (0 or 1)."""
    if after.state == "cancelled":
        return ("already-cancelled", 0) if before.state == "cancelled" else ("cancelled", 1)
    if before.cancel_requested and before.state in ("reserved", "running"):
        return "already-cancel-requested", 0
    return "cancel-requested", 1


@blueprint.post("/tasks/<task_id>/cancel")
async def cancel_task(task_id: str):
    back = await action_form(f"/console/tasks/{task_id}")
    who = principal()
    where = shard()
    before = await where.tasks.get(who.namespace_id, task_id)
    who.require("tasks:cancel", before.queue_id)
    after = await where.tasks.cancel(who.namespace_id, task_id)
    if where.signals is not None and after.cancel_requested and after.state in ("reserved", "running"):
        # As the API's cancel: the Worker holding it hears it now, through whichever node.
        where.signals.cancel(task_id)
    done, changed = cancel_outcome(before, after)
    entry = Entry(
        who=who,
        action=actions.TASK_CANCEL,
        queue_id=after.queue_id,
        task_id=task_id,
        changed=changed,
        outcome=done.replace("-", " "),
    )
    return await answer(back, entry, done)


@blueprint.post("/queues/<queue_id>/<any(pause, resume):verb>")
async def pause_or_resume(queue_id: str, verb: str):
    back = await action_form(f"/console/queues/{queue_id}")
    who = principal()
    where = shard()
    found = await where.tenancy.get_queue(who.namespace_id, queue_id)
    who.require("queues:manage", found.queue_id)
    pause = verb == "pause"
    changed = int(found.paused != pause)
    if changed:
        await where.tenancy.set_queue_paused(who.namespace_id, found.queue_id, pause)
        if not pause and where.signals is not None:
            # Its due tasks may be claimed at once, on every node, instead of at the next scan.
            where.signals.tasks_arrived(found.queue_id)
    done = ("paused" if pause else "resumed") if changed else ("already-paused" if pause else "already-open")
    entry = Entry(
        who=who,
        action=actions.QUEUE_PAUSE if pause else actions.QUEUE_RESUME,
        queue_id=found.queue_id,
        changed=changed,
        outcome=done.replace("-", " "),
    )
    return await answer(back, entry, done)


@blueprint.get("/audit")
async def audit():
    who = principal()
    text = request.args.get("before", "").strip()
    if text and not text.isdecimal():
        return await page("Audit", "console/panels/audit.html", status=400, records=[], error="before: an audit id")
    before = int(text) if text else None
    found = await audit_store().list(
        namespace_id=who.namespace_id, queue_ids=readable(), before=before, limit=AUDIT_PAGE
    )
    return await page(
        "Audit",
        "console/panels/audit.html",
        records=found.records,
        older=None if found.last is None else f"/console/audit?before={found.last}",
        newest="/console/audit" if before is not None else None,
        error=None,
    )
