"""The pruner's transactions: expired finished tasks deleted with what belongs to them.

One batch is one short transaction on one (application, outcome class): read up to
``limit`` expired tasks without locks (oldest first, one range of ``ix_tasks_lease`` per
terminal state of the class, merged),
lock those by primary key with ``SKIP LOCKED``, delete their attempts, their acceptance records (the
``Idempotency-Key`` of a request or batch item, a plan's fire record) and the tasks.
Every node may run batches at once; a row another pruner holds is skipped, so no row
is deleted twice and no pruner waits for another. Which rows are expired is the rule
of ``orbit_node.domain.retention``, applied with the database clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.retention import STATES_OF_CLASS, Retention, RetentionClass


@attrs.frozen
class PruneStats:
    """Rows deleted, per table, and whether a batch found more than it could take."""

    tasks: int = 0
    attempts: int = 0
    records: int = 0
    audit: int = 0
    saturated: bool = False

    def __add__(self, other: PruneStats) -> PruneStats:
        return PruneStats(
            self.tasks + other.tasks,
            self.attempts + other.attempts,
            self.records + other.records,
            self.audit + other.audit,
            self.saturated or other.saturated,
        )

    @property
    def rows(self) -> int:
        return self.tasks + self.attempts + self.records + self.audit


# The tables pruned, as metrics and logs name them, and the PruneStats field of each.
PRUNED_TABLES = {
    "tasks": "tasks",
    "task_attempts": "attempts",
    "idempotency_records": "records",
    "audit_records": "audit",
}


@attrs.frozen
class Batch:
    """What one batch did: its counts, and how far past its retention the newest task it
    deleted was (None when it deleted nothing)."""

    stats: PruneStats
    overdue_s: float | None = None


@attrs.frozen
class ApplicationRetention:
    application_id: str
    name: str
    retention: Retention
    # The application's own values (None: the node's default applies).
    own_succeeded_s: int | None = None
    own_failed_s: int | None = None


@attrs.frozen
class Due:
    """What retention deletes next for one (application, class)."""

    retention_class: RetentionClass
    keep_s: int
    # Expired now, counted up to the cap the caller gave.
    expired: int
    oldest_finished_at: datetime | None
    # When the first task that has not expired yet will (None: no such task).
    next_expiry_at: datetime | None
    now: datetime


@attrs.define(eq=False)
class PruneStore:
    db: Database

    async def applications(self, defaults: Retention) -> list[ApplicationRetention]:
        """Every application of this database with the retention that applies to it."""
        rows = await self.db.fetchall("retention_applications")
        return [
            ApplicationRetention(
                r["application_id"],
                r["name"],
                defaults.applied_to(r),
                r["retain_succeeded_s"],
                r["retain_failed_s"],
            )
            for r in rows
        ]

    async def prune_tasks(self, application_id: str, cls: RetentionClass, keep_s: int, limit: int) -> Batch:
        """One transaction: up to ``limit`` expired tasks of the application's class, oldest
        first, deleted with their attempts and acceptance records."""

        async def body(tx: Tx) -> Batch:
            found = await tx.fetchall_union(
                "prune_candidates_branch",
                "prune_candidates_order",
                [{"state": state} for state in STATES_OF_CLASS[cls]],
                {"application_id": application_id, "keep_s": keep_s, "limit": limit},
            )
            if not found:
                return Batch(PruneStats())
            locked = await tx.fetchall("prune_lock", {"task_ids": tuple(r["task_id"] for r in found)})
            if not locked:
                # Another pruner holds them all: this round leaves the class to it.
                return Batch(PruneStats())
            ids = tuple(r["task_id"] for r in locked)
            attempts = await tx.execute("prune_attempts", {"task_ids": ids})
            records = await tx.execute("prune_records", {"task_ids": ids})
            # Their trace contexts (000026): nothing to count, so it goes with the next statement.
            tx.defer("prune_trace_contexts", {"task_ids": ids})
            tx.defer("prune_task_parents", {"task_ids": ids})
            tx.defer("prune_dependency_failures", {"task_ids": ids})
            tasks = await tx.execute("prune_tasks", {"task_ids": ids})
            stats = PruneStats(tasks, attempts, records, saturated=len(found) >= limit)
            return Batch(stats, float(found[-1]["overdue_s"]))

        return await self.db.transaction(body)

    async def prune_audit(self, keep_s: int, limit: int) -> Batch:
        """One transaction: up to ``limit`` audit records older than ``keep_s``, oldest first."""

        async def body(tx: Tx) -> Batch:
            found = await tx.fetchall("prune_audit_candidates", {"keep_s": keep_s, "limit": limit})
            if not found:
                return Batch(PruneStats())
            deleted = await tx.execute("prune_audit", {"audit_ids": tuple(r["audit_id"] for r in found)})
            return Batch(PruneStats(audit=deleted, saturated=len(found) >= limit))

        return await self.db.transaction(body)

    async def due(self, application_id: str, retention: Retention, *, cap: int) -> Sequence[Due]:
        """What retention deletes next for the application, per class (no locks)."""

        async def body(tx: Tx) -> list[Due]:
            found = []
            for cls in RetentionClass:
                keep_s = retention.of(cls)
                rows: list[dict[str, Any]] = [
                    await tx.fetchrow(
                        "retention_due",
                        {"application_id": application_id, "state": state, "keep_s": keep_s, "cap": cap},
                    )
                    for state in STATES_OF_CLASS[cls]
                ]
                found.append(
                    Due(
                        cls,
                        keep_s,
                        min(cap, sum(int(r["expired"]) for r in rows)),
                        earliest(r["oldest_finished_at"] for r in rows),
                        earliest(r["next_expiry_at"] for r in rows),
                        rows[-1]["now"],
                    )
                )
            return found

        return await self.db.run(body)


def earliest(values: Iterable[datetime | None]) -> datetime | None:
    """The earliest of the values that are not None; None when none is."""
    return min((v for v in values if v is not None), default=None)
