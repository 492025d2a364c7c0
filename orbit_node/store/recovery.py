"""The recovery sweeper's pass over the database: expired reservations back to the
queue, expired run leases as failed attempts, queued tasks past their deadline expired.
What each locked row becomes is ``TransitionRules.recover_row``'s (``transitions.py``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..db import Database, Tx
from ..domain.ownership import At, Outcome, RecoveryStats
from .transitions import TaskRow, TransitionRules, Writes

# requeued(queue_id, due_at, due_in_s): tasks of a queue went back, due at ``due_at``
# (database clock; None: now), ``due_in_s`` after the transaction that put them back.
Requeued = Callable[[str, "datetime | None", "float | None"], None]


async def run_recovery(
    db: Database, rules: TransitionRules, at: At, *, limit: int, requeued: Requeued | None = None
) -> RecoveryStats:
    """One sweep pass over expired leases and queued tasks past their deadline.

    Safe to run on every node at once: candidates are read without locks and then
    locked by primary key with SKIP LOCKED and re-checked against NOW(6), so two
    sweepers (or a sweeper and a Finish) never settle the same row twice, and a
    lease that is still valid on the database clock is never touched.

    The candidates of several applications are settled in one transaction per
    application: no transaction touches two applications' rows (the shard key of
    ``docs/scaling.md``). Once a transaction has committed, ``requeued`` hears of every
    queue it put tasks back in (once per queue and due time) and, as due now, of every
    queue whose task gave up its resource key, so waiting claims on every node can be
    woken.
    """

    async def candidates(tx: Tx) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        leases = await tx.fetchall("recover_lease_candidates", {"limit": limit})
        return leases, await tx.fetchall("recover_deadline_candidates", {"limit": limit})

    leases, deadlines = await db.run(candidates)
    by_application: dict[str, set[str]] = {}
    for found in leases + deadlines:
        by_application.setdefault(found["application_id"], set()).add(found["task_id"])

    def settle(application_id: str, ids: tuple[str, ...]):
        async def body(tx: Tx) -> tuple[RecoveryStats, dict[tuple[str, datetime | None, float | None], None]]:
            locked = await tx.fetchall("recover_lock", {"application_id": application_id, "task_ids": ids})
            rows = [TaskRow.from_row(r) for r in locked]
            await at("recover.locked", [r.task_id for r in rows])
            writes = Writes()
            counts = {o: 0 for o in Outcome}
            for row in rows:
                counts[rules.recover_row(row, writes)] += 1
            await writes.apply(tx)
            back: dict[tuple[str, datetime | None, float | None], None] = {}
            for row in rows:
                if (requeue := writes.requeue.get(row.task_id)) is not None:
                    due_at = requeue["available_at"]
                    due_in_s = None if due_at is None else (due_at - row.now).total_seconds()
                    back[(row.queue_id, due_at, due_in_s)] = None
                if row.task_id in writes.keys:
                    # Its resource key is free now (whenever the task itself is due): a
                    # task of its queue waiting for the key may go.
                    back[(row.queue_id, None, None)] = None
            stats = RecoveryStats(
                requeued=counts[Outcome.RELEASED],
                retried=counts[Outcome.RETRY],
                failed=counts[Outcome.FAILED],
                cancelled=counts[Outcome.CANCELLED],
                expired=counts[Outcome.EXPIRED],
            )
            return stats, back

        return body

    total = RecoveryStats(saturated=len(leases) >= limit or len(deadlines) >= limit)
    for application_id, ids in sorted(by_application.items()):
        stats, back = await db.transaction(settle(application_id, tuple(sorted(ids))))
        total = total + stats
        if requeued is not None:
            for queue_id, due_at, due_in_s in back:
                requeued(queue_id, due_at, due_in_s)
    return total
