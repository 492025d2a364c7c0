"""Tasks as the task interface sees them: acceptance (idempotent), reads, search, cancel, retry.

Acceptance (one task or a batch, one code path) runs in one transaction: it reads the
records of its keys and its queues, decides each submission (``domain/acceptance.py``),
then writes the idempotency records first and the tasks after them, as multi-row
INSERTs. Concurrent submissions with one key serialise on that record's primary key:
the first commits, the others fail with a duplicate key, run again and return (or
refuse) the task the first created, so one key never creates two tasks.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_protocol.limits import MAX_BULK

from ..db import Database, Tx
from ..domain.acceptance import Create, Record, Repeat, Submission, decide
from ..domain.errors import DatabaseError, NotFound, OrbitError
from ..domain.ids import is_hex32, time_ordered_id
from ..domain.rules import NewTask
from ..domain.task_query import TaskCursor, TaskFilter
from .actions import BULK_ACTIONS, RETRIED, ActionOutcome, BulkOutcome, cancel_many, retry_many
from .dependencies import insert_dependencies, parent_documents, parents_by_child, starts_of
from .search import TaskSearchPage, search_tasks, waiting_reasons
from .task_rows import (
    ER_DUP_ENTRY,
    KEY_RACE_RUNS,
    NEW_TASK_COLUMNS,
    QUEUED,
    Task,
    TaskSummary,
    insert_tasks,
    task_row,
)

# idempotency_records.kind of client acceptance keys (plans use their own kind).
KIND_REQUEST = "request"


@attrs.frozen
class Accepted:
    task: Task
    # False when the key had already accepted this same request.
    created: bool
    # A created task's parents (a repeat's are read with the task when asked for).
    parents: tuple[str, ...] = ()


# The filter that matches every task.
NO_FILTER = TaskFilter()


@attrs.define(eq=False)
class TaskStore:
    db: Database
    # Namespace id -> its application id (a namespace never changes application).
    _applications: dict[str, str] = attrs.field(factory=dict, init=False)

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
        ``IdempotencyConflict``); ``orbit_node.domain.acceptance`` decides which. Either
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
        keys = tuple(sorted({k for s in submissions for k in (s.idempotency_key, *s.new.depends_on_keys)}))
        queue_ids = tuple(sorted({s.new.queue_id for s in submissions}))
        named = tuple(sorted({task_id for s in submissions for task_id in s.new.depends_on}))
        reads = [
            tx.statement("idempotency_get_many", {"namespace_id": namespace_id, "kind": kind, "keys": keys}),
            tx.statement("task_submit_queues", {"namespace_id": namespace_id, "queue_ids": queue_ids}),
        ]
        if named:
            reads.append(tx.statement("dependency_parents_lock", {"task_ids": named}))
        found, queues, *locked = await tx.fetchall_each(*reads)
        parents = {r["task_id"]: r for r in (locked[0] if locked else ())}
        records = {r["idempotency_key"]: Record(r["request_digest"], r["task_id"]) for r in found}
        decisions = decide(
            submissions,
            digests,
            records,
            {q["queue_id"]: q["application_id"] for q in queues},
            time_ordered_id,
            {task_id: r["application_id"] for task_id, r in parents.items()},
        )
        created = [(s, d) for s, d in zip(submissions, decisions, strict=True) if isinstance(d, Create)]
        rows: list[dict[str, Any]] = []
        if created:
            now = queues[0]["db_now"]
            starts = await starts_of(
                tx, [d for _, d in created], {task_id: r["state"] for task_id, r in parents.items()}
            )
            await tx.insert_rows(
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
            rows = [
                task_row(d.task_id, d.application_id, namespace_id, s.new, now, start=starts.get(d.task_id, QUEUED))
                for s, d in created
            ]
            await insert_tasks(tx, namespace_id, rows)
            await insert_dependencies(tx, [d for _, d in created], starts)
        # A created task is answered from the values just written (every column is exact:
        # DATETIME(6), DOUBLE, the payload's JSON text); only repeats are read back.
        tasks = {row["task_id"]: Task.from_row({**NEW_TASK_COLUMNS, **row, "updated_at": now}) for row in rows}
        repeated = tuple(sorted({d.task_id for d in decisions if isinstance(d, Repeat)} - tasks.keys()))
        if repeated:
            found = await tx.fetchall("task_get_many", {"namespace_id": namespace_id, "task_ids": repeated})
            tasks.update((row["task_id"], Task.from_row(row)) for row in found)
        # A repeat of a request that named parents answers with the parents it has.
        lineage: dict[str, tuple[str, ...]] = {d.task_id: d.parents for d in decisions if isinstance(d, Create)}
        named_again = tuple(
            sorted(
                {
                    d.task_id
                    for s, d in zip(submissions, decisions, strict=True)
                    if isinstance(d, Repeat) and (s.new.depends_on or s.new.depends_on_keys)
                }
            )
        )
        if named_again:
            rows = await tx.fetchall("dependency_parents_of", {"task_ids": named_again})
            lineage.update((child, tuple(parents)) for child, parents in parents_by_child(rows).items())
        outcomes: list[Accepted | OrbitError] = []
        for decision in decisions:
            if isinstance(decision, OrbitError):
                outcomes.append(decision)
            elif decision.task_id not in tasks:
                # A record whose task is gone (never the case while tasks are kept).
                outcomes.append(NotFound(f"task_id: task {decision.task_id} not found", field="task_id"))
            else:
                outcomes.append(
                    Accepted(
                        tasks[decision.task_id],
                        created=isinstance(decision, Create),
                        parents=lineage.get(decision.task_id, ()),
                    )
                )
        return outcomes

    async def parents(self, task_id: str) -> builtins.list[dict[str, Any]]:
        """A task's parents (``task_id``, ``state``; state None when the parent is gone), by id."""
        rows = await self.db.fetchall("dependency_parents_of", {"task_ids": (task_id,)})
        return parent_documents(parents_by_child(rows).get(task_id, {}))

    async def children(self, task_id: str, *, after: str = "", limit: int = 100) -> builtins.list[dict[str, Any]]:
        """Up to ``limit`` children of a task (``task_id``, ``state``) with ids above ``after``, by id."""
        return await self.db.fetchall("dependency_children_of", {"task_id": task_id, "after": after, "limit": limit})

    async def get(self, namespace_id: str, task_id: str) -> Task:
        row = None
        if is_hex32(task_id):
            row = await self.db.fetchone("task_get", {"namespace_id": namespace_id, "task_id": task_id})
        if row is None:
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        return Task.from_row(row)

    async def states(self, task_ids: Sequence[str]) -> dict[str, str]:
        """The state of each of ``task_ids`` that exists (any namespace), by task id."""
        if not task_ids:
            return {}
        rows = await self.db.fetchall("task_states", {"task_ids": tuple(task_ids)})
        return {row["task_id"]: row["state"] for row in rows}

    # -- finding tasks (store/search.py) -----------------------------------------------

    async def search(
        self,
        namespace_id: str,
        found: TaskFilter = NO_FILTER,
        *,
        queue_ids: Sequence[str] | None = None,
        after: TaskCursor | None = None,
        limit: int = 100,
    ) -> TaskSearchPage:
        """Up to ``limit`` summaries of the namespace's tasks that ``found`` matches, newest
        first by (created_at, task_id), after ``after``. ``queue_ids`` None means every
        queue of the namespace (a queue-scoped credential passes the queues it may read)."""
        application_id = await self._application_of(namespace_id)
        if application_id is None:
            return TaskSearchPage([], None)
        return await search_tasks(
            self.db, namespace_id, application_id, found, queue_ids=queue_ids, after=after, limit=limit
        )

    async def list(
        self,
        namespace_id: str,
        *,
        queue_ids: Sequence[str] | None = None,
        queue_id: str | None = None,
        state: str | None = None,
        limit: int = 100,
    ) -> TaskSearchPage:
        """The newest summaries (of one queue, in one state): ``search``'s first page."""
        found = TaskFilter(queue_id=queue_id, states=() if state is None else (state,))
        return await self.search(namespace_id, found, queue_ids=queue_ids, limit=limit)

    async def waiting_reasons(self, namespace_id: str, tasks: Sequence[TaskSummary]) -> dict[str, str]:
        """task id -> why that queued task waits (QUEUE_PAUSED, APPLICATION_SUSPENDED,
        NO_CAPABLE_WORKER, NOT_DUE, QUOTA, RESOURCE_KEY_HELD), for those held back."""
        return await waiting_reasons(self.db, namespace_id, tasks)

    async def finish_notes(self, namespace_id: str, tasks: Sequence[TaskSummary]) -> dict[str, dict[str, Any]]:
        """task id -> its error as ``CODE: message`` (or the message alone) and the task
        that retried it, for the finished tasks of a listing."""
        finished = tuple(t.task_id for t in tasks if t.finished_at is not None)
        if not finished:
            return {}
        rows = await self.db.fetchall("task_finish_notes", {"namespace_id": namespace_id, "task_ids": finished})
        return {
            r["task_id"]: {"error": error_summary(r["error_code"], r["error_message"]), "retried_by": r["retried_by"]}
            for r in rows
        }

    async def _application_of(self, namespace_id: str) -> str | None:
        """The application of a namespace (a fixed fact, remembered); None if there is none."""
        application_id = self._applications.get(namespace_id)
        if application_id is None:
            row = await self.db.fetchone("task_namespace_application", {"namespace_id": namespace_id})
            if row is None:
                return None
            application_id = self._applications[namespace_id] = row["application_id"]
        return application_id

    # -- cancel and retry (store/actions.py) --------------------------------------------

    async def cancel(self, namespace_id: str, task_id: str) -> Task:
        """Queued: cancelled at once. Reserved/running: cancel requested, state kept.

        Cancelling a cancelled task returns it unchanged; a task that finished in any
        other way cannot be cancelled (FailedPrecondition).
        """
        await self._one(cancel_many, namespace_id, task_id)
        return await self.get(namespace_id, task_id)

    async def retry(self, namespace_id: str, task_id: str) -> Accepted:
        """Retry a failed, cancelled or expired task: its new task (``created``), or the one
        that retried it before (``created`` False). Any other state: FailedPrecondition."""
        outcome = await self._one(retry_many, namespace_id, task_id)
        assert outcome.retry_task_id is not None
        return Accepted(await self.get(namespace_id, outcome.retry_task_id), created=outcome.outcome == RETRIED)

    async def _one(self, action: Any, namespace_id: str, task_id: str) -> ActionOutcome:
        outcomes = await action(self.db, namespace_id, [task_id]) if is_hex32(task_id) else []
        if not outcomes:
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        if outcomes[0].error is not None:
            raise outcomes[0].error
        return outcomes[0]

    async def cancel_many(self, namespace_id: str, task_ids: Sequence[str]) -> builtins.list[ActionOutcome]:
        """Cancel each task (of the namespace) as ``cancel`` would; one outcome per task found."""
        return await cancel_many(self.db, namespace_id, task_ids)

    async def retry_many(self, namespace_id: str, task_ids: Sequence[str]) -> builtins.list[ActionOutcome]:
        """Retry each task (of the namespace) as ``retry`` would; one outcome per task found."""
        return await retry_many(self.db, namespace_id, task_ids)

    async def bulk(
        self,
        action: str,
        namespace_id: str,
        found: TaskFilter,
        *,
        queue_ids: Sequence[str] | None = None,
        after: TaskCursor | None = None,
        limit: int = MAX_BULK,
    ) -> BulkOutcome:
        """``action`` ("cancel" or "retry") on the next ``limit`` tasks ``found`` matches,
        newest first after ``after``, each as ``cancel``/``retry`` would. Unless ``found``
        names states or task ids it takes only the states the action can change (queued,
        reserved, running; failed, cancelled, expired)."""
        run, default_states = BULK_ACTIONS[action]
        if not found.task_ids:
            found = found.with_states(default_states)
        page = await self.search(namespace_id, found, queue_ids=queue_ids, after=after, limit=limit)
        return BulkOutcome(await run(self.db, namespace_id, [t.task_id for t in page.tasks]), page.next_cursor)


def error_summary(code: str | None, message: str | None) -> str | None:
    """``CODE: message``, or the message alone, or None for a task without an error."""
    if code:
        return f"{code}: {message or ''}"
    return message or None
