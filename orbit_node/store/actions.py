"""What operators and integrators do to tasks: cancel and retry, one task or many.

``cancel_many`` and ``retry_many`` take task ids of one namespace and answer one
``ActionOutcome`` per task found, in the order given; a task that cannot be changed is a
refusal in its outcome and never stops the others. The single routes, the bulk routes
(``docs/api.md``, "Bulk cancel and bulk retry"), ``orbit-admin`` and the console all come
through here, so one task is decided the same way whichever way it is asked.

* Cancel locks the rows (primary-key order), decides each with
  ``task_query.cancel_action`` and writes two UPDATEs (queued -> cancelled; reserved or
  running -> cancel requested).
* Retry creates a new task per failed, cancelled or expired task, linked by
  ``retried_from``. The UNIQUE index on it makes a retry exist at most once: a task
  retried before answers its existing retry, and a concurrent retry of the same task
  fails with a duplicate key, runs again and answers the one that committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.errors import DatabaseError, FailedPrecondition
from ..domain.ids import time_ordered_id
from ..domain.rules import NewTask
from ..domain.task_query import (
    CANCEL_NOW,
    CANCEL_REQUEST,
    CANCELLABLE_STATES,
    RETRYABLE_STATES,
    UNCHANGED,
    TaskCursor,
    cancel_action,
    retry_deadline,
    retry_refusal,
)
from .dependencies import defer_failures
from .task_rows import ER_DUP_ENTRY, KEY_RACE_RUNS, insert_tasks, task_row

# Tasks one transaction of a bulk action changes at most: rows stay locked (cancel) or
# inserts stay in one statement of reasonable size (retry) for a few milliseconds only.
ACTION_CHUNK = 250

# Outcomes of one task.
CANCELLED = "cancelled"  # was queued: cancelled now
CANCEL_REQUESTED = "cancel_requested"  # reserved or running: the dispatch side settles it
RETRIED = "retried"  # a new task retries it
REFUSED = "refused"
# UNCHANGED (task_query): cancelled or cancel requested before; retried before.


@attrs.frozen(kw_only=True)
class ActionOutcome:
    """What a cancel or retry did to one task."""

    task_id: str
    queue_id: str
    # CANCELLED, CANCEL_REQUESTED, RETRIED, UNCHANGED or REFUSED.
    outcome: str
    # The task's state after the action (a retried task keeps its terminal state).
    state: str
    # Retry: the task that retries it (new, or the existing one when UNCHANGED).
    retry_task_id: str | None = None
    # REFUSED: why (FailedPrecondition, field task_id).
    error: FailedPrecondition | None = None

    @property
    def changed(self) -> bool:
        return self.outcome in (CANCELLED, CANCEL_REQUESTED, RETRIED)

    def as_json(self) -> dict[str, Any]:
        """The result of one task as the bulk routes and ``orbit-admin --json`` show it."""
        data: dict[str, Any] = {"task_id": self.task_id, "outcome": self.outcome, "state": self.state}
        if self.retry_task_id is not None:
            data["retry_task_id"] = self.retry_task_id
        if self.error is not None:
            data["error"] = {"code": self.error.code, "message": self.error.message, "field": self.error.field}
        return data


@attrs.frozen
class BulkOutcome:
    """One call of a bulk action: an outcome per task it took, and where the next call goes on."""

    outcomes: list[ActionOutcome]
    # Pass as the next call's ``after``; None when no more tasks match.
    next_cursor: TaskCursor | None

    def count(self, *outcomes: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome in outcomes)

    @property
    def changed(self) -> int:
        return sum(1 for o in self.outcomes if o.changed)

    @property
    def unchanged(self) -> int:
        return self.count(UNCHANGED)

    @property
    def refused(self) -> int:
        return self.count(REFUSED)


def _chunks(task_ids: Sequence[str]) -> list[tuple[str, ...]]:
    unique = list(dict.fromkeys(task_ids))
    return [tuple(unique[i : i + ACTION_CHUNK]) for i in range(0, len(unique), ACTION_CHUNK)]


def _in_order(task_ids: Sequence[str], outcomes: Sequence[ActionOutcome]) -> list[ActionOutcome]:
    by_id = {o.task_id: o for o in outcomes}
    return [by_id[t] for t in dict.fromkeys(task_ids) if t in by_id]


async def cancel_many(db: Database, namespace_id: str, task_ids: Sequence[str]) -> list[ActionOutcome]:
    """Cancel these tasks of the namespace (unknown ids are left out of the answer)."""
    outcomes: list[ActionOutcome] = []
    for chunk in _chunks(task_ids):

        async def body(tx: Tx, chunk: tuple[str, ...] = chunk) -> list[ActionOutcome]:
            params = {"namespace_id": namespace_id, "task_ids": chunk}
            done: list[ActionOutcome] = []
            for row in await tx.fetchall("task_lock_states", params):
                task_id, state = row["task_id"], row["state"]
                action = cancel_action(task_id, state, bool(row["cancel_requested"]))
                if isinstance(action, FailedPrecondition):
                    done.append(
                        ActionOutcome(
                            task_id=task_id, queue_id=row["queue_id"], outcome=REFUSED, state=state, error=action
                        )
                    )
                elif action == CANCEL_NOW:
                    done.append(
                        ActionOutcome(task_id=task_id, queue_id=row["queue_id"], outcome=CANCELLED, state="cancelled")
                    )
                else:
                    outcome = CANCEL_REQUESTED if action == CANCEL_REQUEST else UNCHANGED
                    done.append(ActionOutcome(task_id=task_id, queue_id=row["queue_id"], outcome=outcome, state=state))
            queued = tuple(o.task_id for o in done if o.outcome == CANCELLED)
            if queued:
                await tx.execute("task_cancel_queued", {"namespace_id": namespace_id, "task_ids": queued})
                # A waiting task waits no more, and its own children are cancelled after it.
                tx.defer("dependency_waits_delete", {"task_ids": queued})
                defer_failures(tx, queued)
            live = tuple(o.task_id for o in done if o.outcome == CANCEL_REQUESTED)
            if live:
                await tx.execute("task_request_cancel", {"namespace_id": namespace_id, "task_ids": live})
            return done

        outcomes.extend(await db.transaction(body))
    return _in_order(task_ids, outcomes)


async def retry_many(db: Database, namespace_id: str, task_ids: Sequence[str]) -> list[ActionOutcome]:
    """Retry these tasks of the namespace (unknown ids are left out of the answer)."""
    outcomes: list[ActionOutcome] = []
    for chunk in _chunks(task_ids):

        async def body(tx: Tx, chunk: tuple[str, ...] = chunk) -> list[ActionOutcome]:
            return await _retry(tx, namespace_id, chunk)

        runs = 0
        while True:
            runs += 1
            try:
                outcomes.extend(await db.transaction(body))
                break
            except DatabaseError as exc:
                # A concurrent retry of one of these tasks committed between this
                # transaction's read and its insert: run it again, and the read sees it.
                if exc.errno != ER_DUP_ENTRY or runs >= KEY_RACE_RUNS:
                    raise
    return _in_order(task_ids, outcomes)


async def _retry(tx: Tx, namespace_id: str, task_ids: tuple[str, ...]) -> list[ActionOutcome]:
    params = {"namespace_id": namespace_id, "task_ids": task_ids}
    sources = await tx.fetchall("task_retry_sources", params)
    existing = {r["retried_from"]: r["task_id"] for r in await tx.fetchall("task_retries_of", params)}
    done: list[ActionOutcome] = []
    rows: list[dict[str, Any]] = []
    for source in sources:
        task_id, state, queue_id = source["task_id"], source["state"], source["queue_id"]
        refusal = retry_refusal(task_id, state)
        if refusal is not None:
            done.append(ActionOutcome(task_id=task_id, queue_id=queue_id, outcome=REFUSED, state=state, error=refusal))
            continue
        if task_id in existing:
            done.append(
                ActionOutcome(
                    task_id=task_id, queue_id=queue_id, outcome=UNCHANGED, state=state, retry_task_id=existing[task_id]
                )
            )
            continue
        row = _retry_row(namespace_id, source)
        rows.append(row)
        done.append(
            ActionOutcome(
                task_id=task_id, queue_id=queue_id, outcome=RETRIED, state=state, retry_task_id=row["task_id"]
            )
        )
    if rows:
        await insert_tasks(tx, namespace_id, rows)
    return done


def _retry_row(namespace_id: str, source: dict[str, Any]) -> dict[str, Any]:
    """The new task of a retry: what the original asked for, due now, attempts from zero,
    with the original's time from acceptance to deadline counted from now."""
    now = source["db_now"]
    new = NewTask(
        queue_id=source["queue_id"],
        handler=source["handler"],
        handler_version=source["handler_version"],
        payload_version=source["payload_version"],
        payload=None,
        priority=int(source["priority"]),
        deadline=retry_deadline(source["deadline"], source["created_at"], now),
        max_attempts=source["max_attempts"],
        backoff_initial_ms=source["backoff_initial_ms"],
        backoff_max_ms=source["backoff_max_ms"],
        backoff_multiplier=float(source["backoff_multiplier"]),
        resource_key=source["resource_key"],
        # The retry continues the original's trace (a span of its own in the same trace).
        trace_context=source["trace_context"],
    )
    row = task_row(time_ordered_id(), source["application_id"], namespace_id, new, now, retried_from=source["task_id"])
    # The payload's stored text, byte for byte (it is never parsed and written again).
    row["payload"] = source["payload"]
    return row


# What a bulk action runs on the tasks it takes, and the states it takes when its filter
# names neither states nor task ids (those it can change).
BULK_ACTIONS = {
    "cancel": (cancel_many, CANCELLABLE_STATES),
    "retry": (retry_many, RETRYABLE_STATES),
}
