"""Tasks as the task interface sees them: acceptance (idempotent), reads, listing, cancel.

Acceptance (one task or a batch, one code path) runs in one transaction: it reads the
records of its keys and its queues, decides each submission (``store/acceptance.py``),
then writes the idempotency records first and the tasks after them, as multi-row
INSERTs. Concurrent submissions with one key serialise on that record's primary key:
the first commits, the others fail with a duplicate key, run again and return (or
refuse) the task the first created, so one key never creates two tasks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import attrs

from ..db import Database, Tx
from ..errors import DatabaseError, FailedPrecondition, NotFound, OrbitError
from ..ids import is_hex32, time_ordered_id
from ..rules import NewTask
from .acceptance import Create, Record, Repeat, Submission, decide

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
# Runs of one acceptance transaction that concurrent submissions of its keys may cost.
KEY_RACE_RUNS = 5
# The columns of a new task row that task_insert leaves to their defaults (000005).
NEW_TASK_COLUMNS: dict[str, Any] = {
    "state": "queued",
    "attempts": 0,
    "cancel_requested": 0,
    "reserved_at": None,
    "started_at": None,
    "finished_at": None,
    "result": None,
    "error": None,
}
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


def task_row(
    task_id: str,
    application_id: str,
    namespace_id: str,
    new: NewTask,
    now: datetime,
    *,
    plan_id: str | None = None,
    plan_version: int | None = None,
) -> dict[str, Any]:
    """The ``task_insert`` parameters of one accepted task.

    ``now`` is the database clock read in the accepting transaction: the task's
    created_at, and its available_at (plus the delay) unless the request names one.
    """
    return {
        "task_id": task_id,
        "application_id": application_id,
        "namespace_id": namespace_id,
        "queue_id": new.queue_id,
        "handler": new.handler,
        "handler_version": new.handler_version,
        "payload_version": new.payload_version,
        "payload": json.dumps(new.payload, ensure_ascii=False, allow_nan=False),
        "priority": new.priority,
        "available_at": now + timedelta(microseconds=new.delay_us) if new.available_at is None else new.available_at,
        "deadline": new.deadline,
        "max_attempts": new.max_attempts,
        "backoff_initial_ms": new.backoff_initial_ms,
        "backoff_max_ms": new.backoff_max_ms,
        "backoff_multiplier": new.backoff_multiplier,
        "resource_key": new.resource_key,
        "plan_id": plan_id,
        "plan_version": plan_version,
        "created_at": now,
    }


async def insert_tasks(tx: Tx, namespace_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write accepted tasks (``task_row``) and their resource keys' occupancy rows inside ``tx``.

    Multi-row INSERTs; the caller has written the idempotency records first, in the same
    transaction. The API's acceptance and a plan's fire both go through here.
    """
    await tx.execute_rows("task_insert", rows)
    wanted = sorted({row["resource_key"] for row in rows if row["resource_key"] is not None})
    if wanted:
        present = await tx.fetchall(
            "resource_keys_present", {"namespace_id": namespace_id, "resource_keys": tuple(wanted)}
        )
        have = {row["resource_key"] for row in present}
        await tx.execute_rows(
            "resource_key_ensure",
            [{"namespace_id": namespace_id, "resource_key": key} for key in wanted if key not in have],
        )


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
        (outcome,) = await self.submit_many(namespace_id, [Submission(idempotency_key, new)], kind=kind)
        if isinstance(outcome, OrbitError):
            raise outcome
        return outcome

    async def submit_many(
        self, namespace_id: str, submissions: Sequence[Submission], *, kind: str = KIND_REQUEST
    ) -> list[Accepted | OrbitError]:
        """Accept each submission under its key (per namespace), exactly once, in one transaction.

        One answer per submission, in order: ``Accepted`` (created, or the repeat of the
        key's earlier identical request) or the refusal (``NotFound`` queue,
        ``IdempotencyConflict``); ``orbit_node.store.acceptance`` decides which. Either
        every created task of the call is committed or none is.
        """
        if not submissions:
            return []
        digests = [s.new.digest() for s in submissions]

        async def body(tx: Tx) -> list[Accepted | OrbitError]:
            return await self._accept(tx, namespace_id, kind, submissions, digests)

        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.db.transaction(body)
            except DatabaseError as exc:
                # A concurrent submission committed one of the keys between this
                # transaction's read and its insert: run it again, and the read sees it.
                if exc.errno != ER_DUP_ENTRY or attempt >= KEY_RACE_RUNS:
                    raise

    async def _accept(
        self,
        tx: Tx,
        namespace_id: str,
        kind: str,
        submissions: Sequence[Submission],
        digests: Sequence[str],
    ) -> list[Accepted | OrbitError]:
        keys = tuple(sorted({s.idempotency_key for s in submissions}))
        found = await tx.fetchall("idempotency_get_many", {"namespace_id": namespace_id, "kind": kind, "keys": keys})
        records = {r["idempotency_key"]: Record(r["request_digest"], r["task_id"]) for r in found}
        queue_ids = tuple(sorted({s.new.queue_id for s in submissions}))
        queues = await tx.fetchall("task_submit_queues", {"namespace_id": namespace_id, "queue_ids": queue_ids})
        decisions = decide(
            submissions, digests, records, {q["queue_id"]: q["application_id"] for q in queues}, time_ordered_id
        )
        created = [(s, d) for s, d in zip(submissions, decisions, strict=True) if isinstance(d, Create)]
        rows: list[dict[str, Any]] = []
        if created:
            now = queues[0]["db_now"]
            await tx.execute_rows(
                "idempotency_insert",
                sorted(
                    (
                        {
                            "namespace_id": namespace_id,
                            "kind": kind,
                            "idempotency_key": s.idempotency_key,
                            "request_digest": d.digest,
                            "task_id": d.task_id,
                        }
                        for s, d in created
                    ),
                    key=lambda record: record["idempotency_key"],
                ),
            )
            rows = [task_row(d.task_id, d.application_id, namespace_id, s.new, now) for s, d in created]
            await insert_tasks(tx, namespace_id, rows)
        # A created task is answered from the values just written (every column is exact:
        # DATETIME(6), DOUBLE, the payload's JSON text); only repeats are read back.
        tasks = {row["task_id"]: Task.from_row({**row, **NEW_TASK_COLUMNS, "updated_at": now}) for row in rows}
        repeated = tuple(sorted({d.task_id for d in decisions if isinstance(d, Repeat)} - tasks.keys()))
        if repeated:
            found = await tx.fetchall("task_get_many", {"namespace_id": namespace_id, "task_ids": repeated})
            tasks.update((row["task_id"], Task.from_row(row)) for row in found)
        outcomes: list[Accepted | OrbitError] = []
        for decision in decisions:
            if isinstance(decision, OrbitError):
                outcomes.append(decision)
            elif decision.task_id not in tasks:
                # A record whose task is gone (never the case while tasks are kept).
                outcomes.append(NotFound(f"task_id: task {decision.task_id} not found", field="task_id"))
            else:
                outcomes.append(Accepted(tasks[decision.task_id], created=isinstance(decision, Create)))
        return outcomes

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
