"""Dependencies in the database (000027): the writes of the rules of
``orbit_node.domain.dependencies``.

* Acceptance (``store/tasks.py``) locks the parents a submission names (shared), decides
  each new task's start from their states, and writes its edges (``task_parents``) and,
  for a waiting task, its count (``task_waits``).
* A Finish (``store/transitions.py``) reads the edges of the tasks it locked in the same
  round trip as the lock; when one of them succeeds and has children, it locks their
  counts (children in id order), counts it off and releases those it completes, in its
  own transaction. A transaction without such a task reads nothing more.
* A task that ends without success leaves a ``dependency_failures`` row when it has
  children (a statement that goes with the commit); ``DependencyStore.cancel_children``
  (the node's recovery pass) cancels the waiting children of those rows in bounded
  transactions, and their children level by level.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.acceptance import Create
from ..domain.dependencies import FAILED_ENDS, WAITING, Start, count_off, dependency_error, start_of

# Waiting children one transaction of the cascade cancels at most.
CASCADE_BATCH = 256
# (queue id, due time or None for now, seconds until it): a queue a release woke.
Arrival = tuple[str, "datetime | None", "float | None"]


def parents_by_child(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str | None]]:
    """The rows of ``dependency_parents_of``: child id -> {parent id: the parent's state,
    None when it is gone}, parents in id order. Every reader of a task's parents starts here."""
    found: dict[str, dict[str, str | None]] = {}
    for row in rows:
        found.setdefault(row["child_task_id"], {})[row["parent_task_id"]] = row["state"]
    return found


def parent_documents(parents: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """A task's parents as the task API, ``task show`` and exports show them."""
    return [{"task_id": parent, "state": state} for parent, state in parents.items()]


async def starts_of(tx: Tx, created: Sequence[Create], states: Mapping[str, str]) -> dict[str, Start]:
    """The start of each created task, in order (a parent created earlier
    in the same transaction counts with the start it got). ``states``: the states of the
    parents read and locked already; the others (tasks of earlier items' keys that were
    accepted before) are read and locked here."""
    with_parents = [d for d in created if d.parents]
    if not with_parents:
        return {}
    new = {d.task_id for d in created}
    missing = tuple(sorted({p for d in with_parents for p in d.parents} - new - states.keys()))
    known = dict(states)
    if missing:
        known.update(
            (r["task_id"], r["state"]) for r in await tx.fetchall("dependency_parents_lock", {"task_ids": missing})
        )
    starts: dict[str, Start] = {}
    for decision in created:
        if not decision.parents:
            starts[decision.task_id] = Start("queued")
            continue
        # A parent gone between the read and the lock (pruned) can never succeed now.
        start = start_of({p: starts[p].state if p in starts else known.get(p, "expired") for p in decision.parents})
        starts[decision.task_id] = start
    return starts


async def insert_dependencies(tx: Tx, created: Sequence[Create], starts: Mapping[str, Start]) -> None:
    """The edges of the created tasks that have parents, and the counts of the waiting ones."""
    edges = [{"child_task_id": d.task_id, "parent_task_id": parent} for d in created for parent in sorted(d.parents)]
    if not edges:
        return
    await tx.insert_rows("dependency_edges_insert", edges)
    waits = [
        {"task_id": task_id, "parents_left": start.parents_left}
        for task_id, start in sorted(starts.items())
        if start.state == WAITING
    ]
    if waits:
        await tx.insert_rows("dependency_waits_insert", waits)


async def release_children(
    tx: Tx, edges: Sequence[tuple[str, str]], succeeded: Sequence[str]
) -> dict[str, list[Arrival]]:
    """Count the ``succeeded`` parents off their waiting children (``edges``: (parent,
    child) of the tasks the transaction locked) and release those whose count reaches 0.
    Returns, by parent, the arrival of each child it released (a child whose last parents
    succeed together is the first of them's): its queue, due now or at its own time.
    Writes go with the commit."""
    done = set(succeeded)
    children = tuple(sorted({child for parent, child in edges if parent in done}))
    if not children:
        return {}
    locked = await tx.fetchall("dependency_waits_lock", {"task_ids": children})
    waits = {r["task_id"]: int(r["parents_left"]) for r in locked if r["state"] == WAITING}
    counted = count_off(edges, done, waits)
    if counted.still_waiting:
        tx.defer_per_row(
            "dependency_waits_count",
            {task_id: {"parents_left": left} for task_id, left in counted.still_waiting.items()},
        )
    if not counted.released:
        return {}
    tx.defer("dependency_release", {"task_ids": counted.released}, rows=len(counted.released))
    tx.defer("dependency_waits_delete", {"task_ids": counted.released})
    rows = {r["task_id"]: r for r in locked}
    first_parent: dict[str, str] = {}
    for parent, child in sorted(edges):
        if parent in done:
            first_parent.setdefault(child, parent)
    arrivals: dict[str, list[Arrival]] = {}
    for task_id in counted.released:
        row = rows[task_id]
        due_in_s = (row["available_at"] - row["now"]).total_seconds()
        arrival = (row["queue_id"], row["available_at"], due_in_s) if due_in_s > 0 else (row["queue_id"], None, None)
        arrivals.setdefault(first_parent[task_id], []).append(arrival)
    return arrivals


def defer_failures(tx: Tx, task_ids: Sequence[str]) -> None:
    """Tasks that ended without success: those with children get a dependency_failures
    row, with the commit (a read of an empty index range for a task without children)."""
    if task_ids:
        tx.defer("dependency_failures_insert", {"task_ids": tuple(sorted(task_ids))})


@attrs.frozen
class Cascade:
    """What one cascade pass did."""

    cancelled: int = 0
    # It stopped at its bound with work left.
    saturated: bool = False


@attrs.define(eq=False)
class DependencyStore:
    db: Database

    async def cancel_children(self, limit: int = CASCADE_BATCH) -> Cascade:
        """Cancel the waiting children of parents that ended without success, up to
        ``limit`` per transaction and one parent per transaction; every node may run it
        at once (a parent's row another node holds is skipped)."""
        found = await self.db.fetchall("dependency_failures_next", {"limit": limit})
        cancelled = 0
        saturated = len(found) >= limit
        for row in found:
            done, more = await self.db.transaction(_cascade(row["parent_task_id"], limit))
            cancelled += done
            # The children cancelled may have children: another pass takes their rows.
            saturated = saturated or more or done > 0
        return Cascade(cancelled, saturated)


def _cascade(parent_task_id: str, limit: int):
    async def body(tx: Tx) -> tuple[int, bool]:
        marker = await tx.fetchone("dependency_failure_lock", {"parent_task_id": parent_task_id})
        if marker is None:
            # Another node holds it, or it is done.
            return 0, False
        state = marker["state"]
        if state is None or state in FAILED_ENDS:
            children = await tx.fetchall(
                "dependency_children_waiting", {"parent_task_id": parent_task_id, "limit": limit}
            )
        else:
            # Not a failed parent (a row written by a mistake cannot cancel anything).
            children = []
        ids = tuple(r["task_id"] for r in children)
        if ids:
            error = dependency_error(parent_task_id, state or "deleted")
            await tx.execute("dependency_cancel", {"task_ids": ids, "error": error})
            tx.defer("dependency_waits_delete", {"task_ids": ids})
            defer_failures(tx, ids)
        more = len(ids) >= limit
        if not more:
            tx.defer("dependency_failure_delete", {"parent_task_id": parent_task_id})
        return len(ids), more

    return body
