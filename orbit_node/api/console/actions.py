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
from collections.abc import Sequence

from quart import Response, g, request

from ...domain.errors import InvalidArgument, OrbitError
from ...services import Shard
from ...store import audit as actions
from ...store.actions import CANCEL_REQUESTED, CANCELLED
from ...store.audit import AuditStore, Entry
from ...store.task_rows import Task
from ...store.tenancy import Principal
from .answers import DONE_PARAM, UNRECORDED_PARAM, answer_url, back_path
from .views import (
    FORM_TOKEN,
    blueprint,
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


async def action_form(default_back: str, fields: frozenset[str] = ACTION_FIELDS) -> dict[str, list[str]]:
    """The form of an action (only ``fields``), and the page to return to (``g.console_back``:
    a console page, ``default_back`` for anything else)."""
    form = (await request.form).to_dict(flat=False)
    unknown = sorted(set(form) - fields)
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: not a field of this form", field=unknown[0])
    g.console_back = back_path((form.get("back") or [""])[0], default_back)
    return form


async def answer(entry: Entry, params: Sequence[tuple[str, str]], back: str | None = None) -> Response:
    """Record the action, then send the browser back with what was done (``views.DONE``)."""
    answered = list(params)
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
        answered.append((UNRECORDED_PARAM, "1"))
    log.info("console %s by credential %s: %s", entry.action, entry.who.credential_id, entry.outcome)
    return see_other(answer_url(back or g.console_back, answered))


# The answer (views.DONE) of a cancel of one task, by the outcome of store/actions.py.
CANCEL_DONE = {CANCELLED: "cancelled", CANCEL_REQUESTED: "cancel-requested"}


async def one_task(task_id: str, scope: str) -> tuple[Principal, Shard, Task]:
    """An action on one task: its form read, the task found, ``scope`` for its queue."""
    await action_form(f"/console/tasks/{task_id}")
    who = principal()
    where = shard()
    task = await where.tasks.get(who.namespace_id, task_id)
    who.require(scope, task.queue_id)
    return who, where, task


@blueprint.post("/tasks/<task_id>/cancel")
async def cancel_task(task_id: str):
    who, where, task = await one_task(task_id, "tasks:cancel")
    # One decision per task, whichever way it is asked: the API's, orbit-admin's.
    (outcome,) = await where.tasks.cancel_many(who.namespace_id, [task_id])
    if outcome.error is not None:
        raise outcome.error
    # As the API's cancel: the Worker holding it hears it now, through whichever node,
    # and the requests waiting for a task cancelled while queued answer.
    where.after_cancel(task_id, outcome.state)
    done = CANCEL_DONE.get(outcome.outcome) or (
        "already-cancelled" if outcome.state == "cancelled" else "already-cancel-requested"
    )
    entry = Entry(
        who=who,
        action=actions.TASK_CANCEL,
        queue_id=task.queue_id,
        task_id=task_id,
        changed=int(outcome.changed),
        outcome=done.replace("-", " "),
    )
    return await answer(entry, [(DONE_PARAM, done)])


@blueprint.post("/tasks/<task_id>/retry")
async def retry_task(task_id: str):
    who, where, task = await one_task(task_id, "tasks:submit")
    retried = await where.retry_task(who.namespace_id, task_id)
    done = "retried" if retried.created else "already-retried"
    entry = Entry(
        who=who,
        action=actions.TASK_RETRY,
        queue_id=task.queue_id,
        task_id=task_id,
        changed=int(retried.created),
        outcome=f"{done.replace('-', ' ')} as {retried.task.task_id}",
    )
    # The answer is the page of the task that runs it again.
    return await answer(entry, [(DONE_PARAM, done)], back=f"/console/tasks/{retried.task.task_id}")


@blueprint.post("/queues/<queue_id>/<any(pause, resume):verb>")
async def pause_or_resume(queue_id: str, verb: str):
    await action_form(f"/console/queues/{queue_id}")
    who = principal()
    where = shard()
    found = await where.tenancy.get_queue(who.namespace_id, queue_id)
    who.require("queues:manage", found.queue_id)
    pause = verb == "pause"
    changed = int(found.paused != pause)
    if changed:
        await where.set_queue_paused(who.namespace_id, found.queue_id, pause)
    done = ("paused" if pause else "resumed") if changed else ("already-paused" if pause else "already-open")
    entry = Entry(
        who=who,
        action=actions.QUEUE_PAUSE if pause else actions.QUEUE_RESUME,
        queue_id=found.queue_id,
        changed=changed,
        outcome=done.replace("-", " "),
    )
    return await answer(entry, [(DONE_PARAM, done)])


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
