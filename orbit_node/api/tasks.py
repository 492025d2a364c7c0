"""Routes of /v1/tasks: submit (idempotent), detail (waiting for its end when asked),
list (filtered), cancel.

Retry and the bulk actions are ``api/task_actions.py``."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime
from typing import Any

import trio
from opentelemetry.trace import SpanKind
from quart import Blueprint, g, request

from orbit_protocol import logs

from .. import tracing
from ..admission.submit_rate import Admission
from ..domain import rules
from ..domain.acceptance import Submission
from ..domain.errors import OrbitError, PermissionDenied, ResourceExhausted
from ..domain.task_query import FILTER_FIELDS, LIST_FIELDS, TERMINAL_STATES, TaskCursor, filter_from_query
from ..domain.trace_context import TraceContext
from ..domain.wire import rfc3339, stored_json
from ..services import Shard
from ..store.task_rows import Task, TaskSummary
from ..store.tasks import Accepted
from ..store.tenancy import Principal
from . import envelope, validation
from .auth import node_state, require_any, shard

bp = Blueprint("tasks", __name__)

# Query parameters of GET /v1/tasks: the filter's fields and the page's.
LIST_PARAMS = (*FILTER_FIELDS, "limit", "cursor")
# Query parameters of GET /v1/tasks/{id}: how long to wait for the task to finish.
GET_PARAMS = ("wait_s",)


def summary_json(task: TaskSummary) -> dict[str, Any]:
    data: dict[str, Any] = {
        "task_id": task.task_id,
        "queue_id": task.queue_id,
        "handler": task.handler,
        "handler_version": task.handler_version,
        "payload_version": task.payload_version,
        "state": task.state,
    }
    # P3: priority appears only when non-zero; absent means the normal priority 0.
    if task.priority:
        data["priority"] = task.priority
    data.update(
        attempts=task.attempts,
        max_attempts=task.max_attempts,
        available_at=rfc3339(task.available_at),
        deadline=rfc3339(task.deadline),
        resource_key=task.resource_key,
        cancel_requested=task.cancel_requested,
        created_at=rfc3339(task.created_at),
        finished_at=rfc3339(task.finished_at),
        retried_from=task.retried_from,
    )
    return data


def task_json(task: Task, parents: Sequence[str] = ()) -> dict[str, Any]:
    """A task's JSON; ``depends_on`` (its parents) only for a task that has some."""
    data = summary_json(task)
    if parents:
        data["depends_on"] = list(parents)
    data.update(
        payload=task.payload,
        backoff={
            "initial_ms": task.backoff_initial_ms,
            "max_ms": task.backoff_max_ms,
            "multiplier": task.backoff_multiplier,
        },
        reserved_at=rfc3339(task.reserved_at),
        started_at=rfc3339(task.started_at),
        updated_at=rfc3339(task.updated_at),
        plan_id=task.plan_id,
        plan_version=task.plan_version,
    )
    if task.result_json is not None:
        data["result"] = stored_json(task.result_json)
    if task.error_text is not None:
        data["error"] = stored_json(task.error_text)
    return data


@bp.post("/tasks")
async def submit_task():
    who = require_any("tasks:submit")
    key = validation.idempotency_key()
    trace = validation.trace_context()
    with tracing.span("orbit.submit", trace, kind=SpanKind.SERVER) as span:
        new = rules.submit_task(await validation.json_object(required=True), trace_context=stored(trace))
        accepted = await _accept(who, key, new)
        if span.is_recording():
            span.set_attributes(
                {
                    "orbit.task_id": accepted.task.task_id,
                    "orbit.queue_id": new.queue_id,
                    "orbit.handler": new.handler,
                    "orbit.created": accepted.created,
                }
            )
    return envelope.ok(task_json(accepted.task, accepted.parents), 201 if accepted.created else 200)


async def _accept(who: Principal, key: str, new: rules.NewTask) -> Accepted:
    who.require("tasks:submit", new.queue_id)
    state = node_state()
    where = state.shard(who)
    admission = where.rates.admit(who.application_id, 1)
    if not admission.admitted:
        state.metrics.observe_refused(who.application_id, who.application, RATE_REASON)
        raise rate_refused(admission)
    created = False
    try:
        accepted = await where.submits.accept(who.namespace_id, key, new)
        created = accepted.created
    finally:
        # A repeat, a refusal or a failure created nothing: its token goes back.
        if not created:
            where.rates.give_back(who.application_id, 1)
    logs.bind(queue_id=new.queue_id, task_id=accepted.task.task_id)
    if accepted.created and accepted.task.state == "queued":
        # A waiting task (depends_on) is not claimable: its release announces it.
        where.announce([arrival(new, accepted.task)])
    return accepted


# orbit_requests_refused_total's reason for a submission over its application's rate limit.
RATE_REASON = "submit_rate"


def rate_refused(admission: Admission) -> ResourceExhausted:
    """The refusal of a submission over its application's submit rate limit (this node's share)."""
    return ResourceExhausted(
        f"submits_per_second: the application's submit rate limit is reached; retry after {admission.retry_after_s} s",
        field="submits_per_second",
        retry_after_s=admission.retry_after_s,
    )


def arrival(new: rules.NewTask, task: Task) -> tuple[str, datetime | None, float | None]:
    """The queue a created task wakes, and when: at once, or, when the submission held it
    back, at its due time (database clock) and that many seconds after it was written."""
    if not new.held_back:
        return task.queue_id, None, None
    return task.queue_id, task.available_at, (task.available_at - task.created_at).total_seconds()


def item_error(exc: OrbitError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "field": exc.field}


def prefers_minimal() -> bool:
    """The request's ``Prefer`` header (RFC 7240) asks for ``return=minimal``; other
    preferences, and a malformed header, are ignored as the RFC says."""
    for header in request.headers.getlist("Prefer"):
        for preference in header.split(","):
            name, _, value = preference.split(";", 1)[0].partition("=")
            if name.strip().lower() == "return" and value.strip().strip('"').lower() == "minimal":
                return True
    return False


@bp.post("/tasks/batch")
async def submit_batch():
    """Up to 1,000 submissions, each with its own key and the single submit's rules, in one
    transaction; one result per item, in request order (docs/api.md)."""
    who = require_any("tasks:submit")
    validation.no_idempotency_header()
    trace = validation.trace_context()
    with tracing.span("orbit.submit_batch", trace, kind=SpanKind.SERVER) as span:
        response = await _accept_batch(who, stored(trace))
        if span.is_recording():
            span.set_attribute("http.response.status_code", response.status_code)
        return response


def stored(trace: TraceContext | None) -> str | None:
    return None if trace is None else trace.stored()


async def _accept_batch(who: Principal, trace_context: str | None):
    items = rules.batch_tasks(await validation.json_object(required=True))
    # Item index -> its refusal before the store (invalid, or outside the credential's grant).
    refused: dict[int, OrbitError] = {}
    submissions: list[Submission] = []
    # Item index of each submission.
    indexes: list[int] = []
    for index, item in enumerate(items):
        try:
            key, new = rules.batch_item(item, index, trace_context=trace_context)
            field = f"tasks[{index}].queue_id"
            if not who.allows("tasks:submit", new.queue_id):
                raise PermissionDenied(
                    f"{field}: credential lacks scope tasks:submit for queue {new.queue_id}", field=field
                )
        except OrbitError as exc:
            refused[index] = exc
            continue
        submissions.append(
            Submission(
                key,
                new,
                key_field=f"tasks[{index}].idempotency_key",
                queue_field=field,
                field_prefix=f"tasks[{index}].",
            )
        )
        indexes.append(index)
    minimal = prefers_minimal()
    state = node_state()
    where = state.shard(who)
    # The submit rate limit admits the first items, in request order, that its bucket has
    # tokens for; the others are refused each with a 429 of its own (docs/api.md), and none
    # at all refuses the request as a whole.
    admission = where.rates.admit(who.application_id, len(submissions))
    over = len(submissions) - admission.admitted
    if over:
        state.metrics.observe_refused(who.application_id, who.application, RATE_REASON, over)
        if not admission.admitted:
            raise rate_refused(admission)
        for index in indexes[admission.admitted :]:
            refused[index] = rate_refused(admission)
        submissions = submissions[: admission.admitted]
    created = 0
    try:
        done = await where.tasks.submit_many(who.namespace_id, submissions)
        created = sum(1 for outcome in done if not isinstance(outcome, OrbitError) and outcome.created)
    finally:
        # Repeats, refusals and a failed transaction created nothing: their tokens go back.
        where.rates.give_back(who.application_id, len(submissions) - created)
    outcomes = iter(done)
    accepted = iter(submissions)
    results: list[dict[str, Any]] = []
    arrived: list[tuple[str, datetime | None, float | None]] = []
    counts = {"created": 0, "existing": 0, "refused": 0}
    for index in range(len(items)):
        if index in refused:
            outcome: Accepted | OrbitError = refused[index]
        else:
            outcome, submission = next(outcomes), next(accepted)
        if isinstance(outcome, OrbitError):
            counts["refused"] += 1
            results.append({"index": index, "status": outcome.http_status, "error": item_error(outcome)})
            continue
        counts["created" if outcome.created else "existing"] += 1
        if outcome.created and outcome.task.state == "queued":
            arrived.append(arrival(submission.new, outcome.task))
        status = 201 if outcome.created else 200
        if minimal:
            task = outcome.task
            results.append({"index": index, "status": status, "task_id": task.task_id, "state": task.state})
        else:
            results.append({"index": index, "status": status, "task": task_json(outcome.task, outcome.parents)})
    logs.bind(tasks=len(items), **counts)
    where.announce(sorted(arrived, key=lambda a: (a[0], a[1] or datetime.min)))
    response = envelope.ok({**counts, "results": results})
    if minimal:
        response.headers["Preference-Applied"] = "return=minimal"
    if over:
        response.headers["Retry-After"] = str(admission.retry_after_s)
    return response


@bp.get("/tasks/<task_id>")
async def get_task(task_id: str):
    """One task; with ``wait_s``, once it is finished or after at most that many seconds,
    as it is then (docs/api.md, "Waiting for a task")."""
    who = require_any("tasks:read")
    wait_s = validation.wait_s(validation.query(GET_PARAMS))
    task_id = rules.path_id(task_id, "task_id")
    where = shard()
    task = await where.tasks.get(who.namespace_id, task_id)
    who.require("tasks:read", task.queue_id)
    if wait_s and task.state not in TERMINAL_STATES:
        task = await until_finished(where, who.namespace_id, task_id, trio.current_time() + wait_s)
    parents = await where.tasks.parents(task.task_id)
    return envelope.ok(task_json(task, [p["task_id"] for p in parents]))


@bp.get("/tasks/<task_id>/children")
async def list_children(task_id: str):
    """The tasks that name this one in depends_on, by id, with their states; ``after`` (a
    child's id) pages on (docs/api.md, "Dependencies")."""
    who = require_any("tasks:read")
    params = validation.query_lists(("limit", "after"), ())
    single = {name: values[0] for name, values in params.items()}
    limit = validation.limit(single)
    after = rules.path_id(single["after"], "after") if "after" in single else ""
    tasks = shard().tasks
    task = await tasks.get(who.namespace_id, rules.path_id(task_id, "task_id"))
    who.require("tasks:read", task.queue_id)
    found = await tasks.children(task.task_id, after=after, limit=limit + 1)
    children = found[:limit]
    return envelope.ok(
        [{"task_id": c["task_id"], "state": c["state"]} for c in children],
        next_cursor=children[-1]["task_id"] if len(found) > limit else None,
    )


async def until_finished(where: Shard, namespace_id: str, task_id: str, deadline: float) -> Task:
    """The task once it is finished, or at ``deadline`` (or the node's shutdown) as it is
    then. It waits outside its application's turn and holding no database session; each
    wake-up (``dispatch/waits.py``) is one read of the task."""
    while True:
        async with away_from_turn():
            began = trio.current_time()
            woken = await where.waits.wait(task_id, deadline)
            # Not the node's work: the access log and the HTTP metrics leave it out.
            g.orbit_waited = g.get("orbit_waited", 0.0) + trio.current_time() - began
        task = await where.tasks.get(namespace_id, task_id)
        if not woken or task.state in TERMINAL_STATES or trio.current_time() >= deadline:
            return task


def away_from_turn() -> AbstractAsyncContextManager[object]:
    """The request's turn of the node's fair admission, given back for the block."""
    turn = g.get("orbit_turn")
    return nullcontext() if turn is None else turn.away()


async def check_queue_filter(who: Principal, queue_id: str | None, scope: str = "tasks:read") -> None:
    """A ``queue_id`` filter: well formed, within the credential's ``scope``, a queue of the namespace."""
    if queue_id is not None:
        rules.path_id(queue_id, "queue_id")
        who.require(scope, queue_id)
        await shard().tenancy.get_queue(who.namespace_id, queue_id)


def cursor_text(cursor: TaskCursor | None) -> str | None:
    return None if cursor is None else cursor.encode()


@bp.get("/tasks")
async def list_tasks():
    """Summaries newest first by (created_at, task_id), filtered (docs/api.md, "Listing"),
    each with the ``waiting_reason`` of a queued task that something holds back."""
    who = require_any("tasks:read")
    params = validation.query_lists(LIST_PARAMS, repeatable=LIST_FIELDS)
    found = filter_from_query(params)
    single = {name: values[0] for name, values in params.items()}
    after = TaskCursor.decode(single["cursor"]) if "cursor" in single else None
    limit = validation.limit(single)
    await check_queue_filter(who, found.queue_id)
    tasks = shard().tasks
    page = await tasks.search(
        who.namespace_id, found, queue_ids=who.queue_filter("tasks:read"), after=after, limit=limit
    )
    waiting = await tasks.waiting_reasons(who.namespace_id, page.tasks)
    return envelope.ok(
        [{**summary_json(t), "waiting_reason": waiting.get(t.task_id)} for t in page.tasks],
        next_cursor=cursor_text(page.next_cursor),
    )


@bp.post("/tasks/<task_id>/cancel")
async def cancel_task(task_id: str):
    who = require_any("tasks:cancel")
    rules.path_id(task_id, "task_id")
    rules.no_fields(await validation.json_object(required=False))
    tasks = shard().tasks
    task = await tasks.get(who.namespace_id, task_id)
    who.require("tasks:cancel", task.queue_id)
    cancelled = await tasks.cancel(who.namespace_id, task_id)
    shard().after_cancel(task_id, cancelled.state)
    return envelope.ok(task_json(cancelled))
