"""Reads only the web console makes: a task's page without its whole stored values, one
value whole, and the due tasks of a queue that no connected Worker can run.

A task's payload, result and errors may be large (a payload up to the node's body
limit): the page reads the beginning of each and its size, and links to a route that
returns the value whole (``value``). Whether a connected Worker can run a task is
decided by the explanation's own check (``store/explain.py``), here once per capability
of a queue's due tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.errors import NotFound
from ..domain.ids import is_hex32
from ..domain.task_query import EPOCH, TaskCursor, TaskFilter
from .explain import capable_connections, live_connections
from .search import TaskSearchPage, _params
from .task_rows import PRIORITY_STEP_S, TaskSummary

# The stored values of a task the console shows (tasks' JSON text columns).
VALUES = ("payload", "result", "error")
# The most (queue, capability) groups of due tasks checked against the connected Workers
# per read (the groups with the most due tasks; the rest are not reported).
MAX_CAPABILITY_GROUPS = 200


# The digits of a task id that hold its acceptance time (milliseconds, ids.time_ordered_id).
TIME_DIGITS = 12
# How far a task's created_at (the database clock) may be from the time its id begins with
# (the accepting node's clock) for a search by id prefix to find it.
CLOCK_MARGIN = timedelta(minutes=10)
# The datetimes the database keeps (DATETIME's range).
FIRST, LAST = datetime(1000, 1, 1), datetime(9999, 12, 31, 23, 59, 59)


def prefix_window(prefix: str) -> tuple[datetime, datetime]:
    """The acceptance times of the task ids that start with ``prefix`` (hex), widened by
    ``CLOCK_MARGIN`` on each side, within the database's range."""
    digits = prefix[:TIME_DIGITS]
    low = int(digits.ljust(TIME_DIGITS, "0"), 16)
    high = int(digits.ljust(TIME_DIGITS, "f"), 16) + 1
    try:
        start = max(FIRST, EPOCH + timedelta(milliseconds=low) - CLOCK_MARGIN)
    except OverflowError:
        start = LAST
    try:
        end = min(LAST, EPOCH + timedelta(milliseconds=high) + CLOCK_MARGIN)
    except OverflowError:
        end = LAST
    return start, end


@attrs.frozen
class Head:
    """The beginning of a stored value (JSON text) and the size of the whole."""

    text: str
    # Bytes of the whole stored value.
    size: int

    @property
    def whole(self) -> bool:
        return len(self.text.encode()) >= self.size


def _head(row: Mapping[str, Any], name: str) -> Head | None:
    text = row[f"{name}_head"]
    return None if text is None else Head(text, int(row[f"{name}_bytes"]))


@attrs.frozen(kw_only=True)
class Stranded:
    """Due tasks of a queue that no connected Worker can run: none announces their
    capability for the queue (or resource-key support, for tasks that name a key)."""

    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    keyed: bool
    due: int


@attrs.define(eq=False)
class ConsoleStore:
    db: Database

    async def task(
        self, namespace_id: str, task_id: str, *, with_payload: bool, head_chars: int, error_chars: int
    ) -> dict[str, Any]:
        """A task of the namespace with its attempts: fields as stored, and of each value
        (payload only ``with_payload``, result, error, each attempt's error) a ``Head`` of
        ``head_chars`` characters (errors: ``error_chars``), or None when unset. A task of
        another namespace is not found, like a missing one."""
        if not is_hex32(task_id):
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        params = {
            "namespace_id": namespace_id,
            "task_id": task_id,
            "with_payload": with_payload,
            "head_chars": head_chars,
            "error_chars": error_chars,
        }

        async def body(tx: Tx) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
            row = await tx.fetchone("console_task", params)
            if row is None:
                return None, []
            return row, await tx.fetchall("console_task_attempts", params)

        row, attempts = await self.db.transaction(body, isolation="REPEATABLE READ")
        if row is None:
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        task = {key: value for key, value in row.items() if not key.endswith(("_head", "_bytes"))}
        task["cancel_requested"] = bool(row["cancel_requested"])
        task.update((name, _head(row, name)) for name in VALUES)
        task["attempt_history"] = [
            {
                **{key: value for key, value in a.items() if not key.startswith("error_")},
                "error": _head(a, "error"),
            }
            for a in attempts
        ]
        return task

    async def value(self, namespace_id: str, task_id: str, name: str) -> tuple[str, str | None]:
        """(queue id, the stored text of value ``name`` whole, None when unset)."""
        if name not in VALUES:
            raise NotFound(f"value: a task has no value {name!r}", field="value")
        return await self._value("console_task_value", namespace_id, task_id, name=name)

    async def attempt_error(self, namespace_id: str, task_id: str, attempt_id: int) -> tuple[str, str | None]:
        """(queue id, the stored error of one attempt of the task whole, None when unset)."""
        return await self._value("console_attempt_error", namespace_id, task_id, attempt_id=attempt_id)

    async def _value(self, query: str, namespace_id: str, task_id: str, **params: Any) -> tuple[str, str | None]:
        row = None
        if is_hex32(task_id):
            row = await self.db.fetchone(query, {"namespace_id": namespace_id, "task_id": task_id, **params})
        if row is None:
            raise NotFound(f"task_id: task {task_id} not found", field="task_id")
        return row["queue_id"], row["value"]

    async def stranded(self, namespace_id: str, queue_ids: Sequence[str]) -> list[Stranded]:
        """Due tasks of these queues (of one namespace) that no connected Worker can run,
        grouped by capability, most first per queue. The (queue, capability) groups with
        the most due tasks are checked, ``MAX_CAPABILITY_GROUPS`` at most."""
        if not queue_ids:
            return []

        async def body(tx: Tx) -> list[Stranded]:
            groups = await tx.fetchall(
                "console_due_capabilities",
                {"queue_ids": tuple(queue_ids), "priority_step_s": PRIORITY_STEP_S, "limit": MAX_CAPABILITY_GROUPS},
            )
            found = []
            connections = await live_connections(tx, namespace_id) if groups else []
            for group in groups:
                # The explanation's check, for a task of this capability: a key stands
                # for any resource key (only whether the task names one matters).
                task = {**group, "resource_key": "" if group["keyed"] else None}
                if capable_connections(connections, task) == 0:
                    found.append(
                        Stranded(
                            queue_id=group["queue_id"],
                            handler=group["handler"],
                            handler_version=group["handler_version"],
                            payload_version=group["payload_version"],
                            keyed=bool(group["keyed"]),
                            due=int(group["due"]),
                        )
                    )
            return found

        return await self.db.transaction(body, isolation="REPEATABLE READ")

    async def search_prefix(
        self,
        namespace_id: str,
        prefix: str,
        found: TaskFilter,
        *,
        queue_ids: Sequence[str] | None,
        after: TaskCursor | None,
        limit: int,
    ) -> TaskSearchPage:
        """``TaskStore.search`` for the tasks whose id starts with ``prefix`` (1 to 31
        lowercase hex digits): the same filter, order and cursor."""
        if found.matches_nothing or (queue_ids is not None and not queue_ids):
            return TaskSearchPage([], None)
        params = _params(namespace_id, found, queue_ids, after, limit)
        start, end = prefix_window(prefix)
        if found.created_after is not None:
            start = max(start, found.created_after)
        if found.created_before is not None:
            end = min(end, found.created_before)
        params.update(
            created_after=start,
            created_before=end,
            id_low=prefix,
            id_high=prefix + "g",
            any_state=not found.states,
            states=found.states or ("",),
        )
        rows = await self.db.fetchall("console_task_prefix", params)
        tasks = [TaskSummary.from_row(r) for r in rows[:limit]]
        last = tasks[-1] if len(rows) > limit else None
        return TaskSearchPage(tasks, None if last is None else TaskCursor(last.created_at, last.task_id))
