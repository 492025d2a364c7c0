"""The recovery sweeper: a node service that settles what lost its owner.

Every node runs one; they may all sweep at once (the database transactions skip rows
another sweeper holds). A pass puts expired reservations back in the queue, counts
expired run leases as failed attempts, and expires queued tasks past their deadline;
then it cancels the waiting children of tasks that ended without success
(``store/dependencies.py``), in bounded transactions.
Decisions use the database clock only; the trio clock here just paces the passes.
What a pass puts back in a queue is announced (``tasks_arrived``, the signals between
nodes) once it has committed, so the Workers waiting on that queue, on any node, are
woken at once, or when a retry's backoff ends, instead of when their empty-result
memory expires.
"""

from __future__ import annotations

import logging

import attrs

from ..domain.ownership import RecoveryStats
from ..store.dependencies import DependencyStore
from ..store.leases import LeaseStore
from ..store.recovery import Requeued
from .periodic import PeriodicService

log = logging.getLogger("orbit.recovery")


@attrs.define(eq=False)
class Sweeper(PeriodicService):
    store: LeaseStore
    interval_s: float
    totals: RecoveryStats = attrs.field(factory=RecoveryStats)
    # Hears of each queue a pass put tasks back in (queue_id, due_at, due_in_s).
    tasks_arrived: Requeued | None = None
    dependencies: DependencyStore | None = None
    # Waiting tasks cancelled because a parent did not succeed, since start.
    dependency_cancelled: int = 0

    log = log
    failure = "recovery pass failed"

    async def one_pass(self) -> RecoveryStats:
        stats = await self.store.recover(requeued=self.tasks_arrived)
        if self.dependencies is None:
            return stats
        cascade = await self.dependencies.cancel_children()
        if cascade.cancelled:
            self.dependency_cancelled += cascade.cancelled
            log.info("cancelled %d waiting tasks whose parent did not succeed", cascade.cancelled)
        return stats if not cascade.saturated else stats + RecoveryStats(saturated=True)

    def empty_stats(self) -> RecoveryStats:
        return RecoveryStats()

    async def sweep(self) -> RecoveryStats:
        """Run passes until one is not saturated (bounded); returns what they settled."""
        return await self.run_round()

    def report(self, swept: RecoveryStats) -> None:
        log.info(
            "recovered tasks: requeued=%d retried=%d failed=%d cancelled=%d expired=%d",
            swept.requeued,
            swept.retried,
            swept.failed,
            swept.cancelled,
            swept.expired,
        )
