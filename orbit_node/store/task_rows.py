"""Task rows as the repositories read and write them: the row types, and new task rows.

``TaskSummary`` (a listing's columns) and ``Task`` (every column) are built from rows of
the named queries; ``task_row`` and ``insert_tasks`` write new tasks, for the API's
acceptance (``store/tasks.py``), a plan's fire (``store/plans.py``) and a retry
(``store/actions.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import attrs

from ..db import Tx
from ..domain.dependencies import Start
from ..domain.rules import NewTask

# Each priority level moves a task's dispatch ordering time this much earlier: the
# generated column of 000012, dispatch_at = available_at - priority * 30 s. Readers that
# take the level back from the dispatch index divide by it.
PRIORITY_STEP_S = 30

# MySQL's duplicate-key error.
ER_DUP_ENTRY = 1062
# Runs of one transaction that concurrent writers of its unique keys may cost (acceptance
# records, retries).
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

# A task without parents starts queued.
QUEUED = Start("queued")

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
    # The task this one retries (POST /v1/tasks/{id}/retry), else None.
    retried_from: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Any:
        """Build from a row of the named queries (subclasses read their own columns too)."""
        return cls(**{name: row[column] for name, column in _columns(cls)})


# Row type -> (field, the column it is read from) of each of its fields.
_COLUMNS: dict[type, tuple[tuple[str, str], ...]] = {}


def _columns(cls: type) -> tuple[tuple[str, str], ...]:
    found = _COLUMNS.get(cls)
    if found is None:
        found = _COLUMNS[cls] = tuple((f.name, f.metadata.get("column") or f.name) for f in attrs.fields(cls))
    return found


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


# The item type of a page: TaskSummary, or a subclass (a plan's listing gives PlanTask).
S = TypeVar("S", bound=TaskSummary)


@attrs.frozen
class TaskPage(Generic[S]):
    tasks: list[S]
    # The last task id of this page when another page may follow, else None.
    last: str | None


# A payload's stored text (json.dumps's default separators), one encoder for every task.
_PAYLOAD_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def task_row(
    task_id: str,
    application_id: str,
    namespace_id: str,
    new: NewTask,
    now: datetime,
    *,
    plan_id: str | None = None,
    plan_version: int | None = None,
    retried_from: str | None = None,
    start: Start = QUEUED,
) -> dict[str, Any]:
    """The ``task_insert`` parameters of one accepted task (or retry).

    ``now`` is the database clock read in the accepting transaction: the task's
    created_at, and its available_at (plus the delay) unless the request names one.
    ``start``: the state its parents give it (``orbit_node.domain.dependencies``).
    """
    return {
        "task_id": task_id,
        "application_id": application_id,
        "namespace_id": namespace_id,
        "queue_id": new.queue_id,
        "handler": new.handler,
        "handler_version": new.handler_version,
        "payload_version": new.payload_version,
        "payload": _PAYLOAD_JSON.encode(new.payload),
        "priority": new.priority,
        "state": start.state,
        "error": start.error,
        "finished_at": now if start.state == "cancelled" else None,
        "available_at": now + timedelta(microseconds=new.delay_us) if new.available_at is None else new.available_at,
        "deadline": new.deadline,
        "max_attempts": new.max_attempts,
        "backoff_initial_ms": new.backoff_initial_ms,
        "backoff_max_ms": new.backoff_max_ms,
        "backoff_multiplier": new.backoff_multiplier,
        "resource_key": new.resource_key,
        "plan_id": plan_id,
        "plan_version": plan_version,
        "retried_from": retried_from,
        "trace_context": new.trace_context,
        "created_at": now,
    }


async def insert_tasks(tx: Tx, namespace_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write accepted tasks (``task_row``) and their resource keys' occupancy rows inside ``tx``.

    Multi-row INSERTs (the tasks' deferred to the transaction's next packet when short:
    ``Tx.insert_rows``), and the trace contexts of those that carry one (000026); the
    caller has written the idempotency records first, in the same transaction. The API's acceptance, a plan's fire and a retry all go through here.
    """
    await tx.insert_rows("task_insert", rows)
    traced = [row for row in rows if row["trace_context"] is not None]
    if traced:
        await tx.insert_rows("task_trace_context_insert", traced)
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
