"""Tasks as the task interface sees them: acceptance (idempotent), reads, listing, cancel.

Acceptance writes the idempotency record first, in the same transaction as the task.
Concurrent submissions with one key serialise on that record's primary key: the
first commits, the others fail with a duplicate key and return (or refuse) the task
the first created, so one key never creates two tasks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

import attrs

from ..db import Database, Tx
from ..errors import DatabaseError, FailedPrecondition, IdempotencyConflict, NotFound
from ..ids import is_hex32, time_ordered_id
from ..rules import NewTask

STATES = ("queued", "reserved", "running", "succeeded", "failed", "cancelled", "expired")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})

# Each priority level moves a task's dispatch ordering time this much earlier: the
# generated column of 000012, dispatch_at = available_at - priority * 30 s. Readers that
# take the level back from the dispatch index divide by it.
PRIORITY_STEP_S = 30

# idempotency_records.kind of client acceptance keys (plans use their own kind).
KIND_REQUEST = "request"
# MySQL's duplicate-key error.
ER_DUP_ENTRY = 1062
# Sorts above every 32-hex task id: the "before" bound of a listing's first page.
LIST_START = "g"


def _column(name: str | None = None, *, converter: Any = None) -> Any:
    """A row-type field read from ``name`` (default: the field's own name)."""
    return attrs.field(metadata={"column": name}, converter=converter)


@attrs.frozen(kw_only=True)
class TaskSummary:
    """What a listing returns: no payload, result or error."""

    task_id: str
    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    state: str
    priority: int = _column(converter=int)
    available_at: datetime
    deadline: datetime | None
    attempts: int
    max_attempts: int
    resource_key: str | None
    cancel_requested: bool = _column(converter=bool)
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Any:
        """Build from a row of the named queries (subclasses read their own columns too)."""
        return cls(**{f.name: row[f.metadata.get("column") or f.name] for f in attrs.fields(cls)})


@attrs.frozen(kw_only=True)
class Task(TaskSummary):
    """One task row. JSON columns stay text; ``payload`` parses on demand."""

    application_id: str
    namespace_id: str
    payload_json: str = _column("payload")
    backoff_initial_ms: int
    backoff_max_ms: int
    backoff_multiplier: float = _column(converter=float)
    reserved_at: datetime | None
    started_at: datetime | None
    updated_at: datetime
    result_json: str | None = _column("result")
    error_text: str | None = _column("error")
    plan_id: str | None
    plan_version: int | None

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)


@attrs.frozen
class Accepted:
    task: Task
    # False when the key had already accepted this same request.
    created: bool


# The item type of a page: TaskSummary, or a subclass (a plan's listing gives PlanTask).
S = TypeVar("S", bound=TaskSummary)


@attrs.frozen
class TaskPage(Generic[S]):
    tasks: list[S]
    # The last task id of this page when another page may follow, else None.
    last: str | None


async def insert_task(
    tx: Tx,
    task_id: str,
    application_id: str,
    namespace_id: str,
    new: NewTask,
    *,
    plan_id: str | None = None,
    plan_version: int | None = None,
) -> None:
    """Write one accepted task (and its resource key's occupancy row) inside ``tx``.

    The caller has written the idempotency record first, in the same transaction: the
    API's acceptance and a plan's fire both go through here.
    """
    await tx.execute(
        "task_insert",
        {
            "task_id": task_id,
            "application_id": application_id,
            "namespace_id": namespace_id,
            "queue_id": new.queue_id,
            "handler": new.handler,
            "handler_version": new.handler_version,
            "payload_version": new.payload_version,
            "payload": json.dumps(new.payload, ensure_ascii=False, allow_nan=False),
            "priority": new.priority,
            "available_at": new.available_at,
            "delay_us": new.delay_us,
            "deadline": new.deadline,
            "max_attempts": new.max_attempts,
            "backoff_initial_ms": new.backoff_initial_ms,
            "backoff_max_ms": new.backoff_max_ms,
            "backoff_multiplier": new.backoff_multiplier,
            "resource_key": new.resource_key,
            "plan_id": plan_id,
            "plan_version": plan_version,
        },
    )
    if new.resource_key is not None:
        rk = {"namespace_id": namespace_id, "resource_key": new.resource_key}
        if await tx.fetchone("resource_key_exists", rk) is None:
            await tx.execute("resource_key_ensure", rk)


@attrs.define(eq=False)
class TaskStore:
    db: Database

    async def submit(
        self, namespace_id: str, idempotency_key: str, new: NewTask, *, kind: str = KIND_REQUEST
    ) -> Accepted:
        """Accept ``new`` under ``idempotency_key`` (per namespace), exactly once.

        Raises NotFound when the queue is not in the namespace and IdempotencyConflict
        when the key already accepted a request with another digest.
        """
        digest = new.digest()
        key = {"namespace_id": namespace_id, "kind": kind, "idempotency_key": idempotency_key}
        # Fast path for retries: the record is already there.
        previous = await self._replay(key, digest)
        if previous is not None:
            return Accepted(previous, created=False)
        task_id = time_ordered_id()

        async def body(tx: Tx) -> dict[str, Any]:
            queue = await tx.fetchone("task_submit_queue", {"namespace_id": namespace_id, "queue_id": new.queue_id})
            if queue is None:
                raise NotFound(f"queue_id: queue {new.queue_id} not found", field="queue_id")
            await tx.execute("idempotency_insert", {**key, "request_digest": digest, "task_id": task_id})
            await insert_task(tx, task_id, queue["application_id"], namespace_id, new)
            return await tx.fetchrow("task_get", {"namespace_id": namespace_id, "task_id": task_id})

        try:
            row = await self.db.transaction(body)
        except DatabaseError as exc:
            if exc.errno != ER_DUP_ENTRY:
                raise
            # Another submission with this key committed first.
            previous = await self._replay(key, digest)
            if previous is None:
                raise
            return Accepted(previous, created=False)
        return Accepted(Task.from_row(row), created=True)

    async def _replay(self, key: Mapping[str, str], digest: str) -> Task | None:
        record = await self.db.fetchone("idempotency_get", key)
        if record is None:
            return None
        if record["request_digest"] != digest:
            raise IdempotencyConflict(
                "Idempotency-Key: this key already accepted a different request", field="Idempotency-Key"
            )
        return await self.get(key["namespace_id"], record["task_id"])

    async def get(self, namespace_id: str, task_id: str) -> Task:
        row = None
        if is_hex32(task_id):
            row = await self.db.fetchone("task_get", {"namespace_id": namespace_id, "task_id": task_id})
        if row is None:
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        return Task.from_row(row)

    async def list(
        self,
        namespace_id: str,
        *,
        queue_ids: Sequence[str] | None = None,
        queue_id: str | None = None,
        state: str | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> TaskPage[TaskSummary]:
        """Summaries, newest first. ``queue_ids`` None means every queue of the namespace."""
        if queue_ids is not None and not queue_ids:
            return TaskPage([], None)
        rows = await self.db.fetchall(
            "task_list",
            {
                "namespace_id": namespace_id,
                "before": before or LIST_START,
                "queue_id": queue_id,
                "state": state,
                "all_queues": queue_ids is None,
                # IN () is not valid SQL; the flag above makes this list irrelevant.
                "queue_ids": tuple(queue_ids) if queue_ids is not None else ("",),
                "limit": limit + 1,
            },
        )
        tasks = [TaskSummary.from_row(r) for r in rows[:limit]]
        return TaskPage(tasks, tasks[-1].task_id if len(rows) > limit else None)

    async def cancel(self, namespace_id: str, task_id: str) -> Task:
        """Queued: cancelled at once. Reserved/running: cancel requested, state kept.

        Cancelling a cancelled task returns it unchanged; a task that finished in any
        other way cannot be cancelled (FailedPrecondition).
        """
        if not is_hex32(task_id):
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        params = {"namespace_id": namespace_id, "task_id": task_id}

        async def body(tx: Tx) -> dict[str, Any]:
            row = await tx.fetchone("task_lock_state", params)
            if row is None:
                raise NotFound(f"task_id: task {task_id} not found", field="task_id")
            state = row["state"]
            if state == "queued":
                await tx.execute("task_cancel_queued", params)
            elif state in ("reserved", "running"):
                await tx.execute("task_request_cancel", params)
            elif state != "cancelled":
                raise FailedPrecondition(
                    f"task_id: task {task_id} already finished as {state}; it cannot be cancelled", field="task_id"
                )
            return await tx.fetchrow("task_get", params)

        return Task.from_row(await self.db.transaction(body))
