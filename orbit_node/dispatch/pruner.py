"""The pruner: a node service that deletes finished tasks once their retention has passed.

Every node runs one, without a leader: batches lock their rows with ``SKIP LOCKED``, so
two nodes never delete the same row and never wait for each other
(``store/pruning.py``). A round visits every (application, outcome class) of the
database in turn, one batch each, and comes back to those that had more, until none
has; audit records older than their own retention go last. Then the pruner sleeps for
its interval. The trio clock only paces; what has expired is decided by the database
clock inside each batch.

The pace is bounded: after a batch the pruner waits until the batch's tasks fit the
rate (``ORBIT_PRUNE_RATE`` tasks per second), and at least as long as the batch took,
so a pruner catching up on a long outage never holds a database connection more than
half the time, and a slow database slows it down rather than the dispatch. On shutdown
it stops between batches: each batch is one transaction, deleted entirely or not at all.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ..domain.retention import Retention, RetentionClass
from ..store.pruning import ApplicationRetention, Batch, PruneStats, PruneStore
from .periodic import PeriodicService

log = logging.getLogger("orbit.retention")

# Tasks per batch: with one or two attempts each and their acceptance record, a batch
# deletes about 600-800 rows in one short transaction.
PRUNE_BATCH = 200
# Audit records per batch (one row each).
AUDIT_BATCH = 1000


@attrs.define(eq=False)
class Pruner(PeriodicService):
    store: PruneStore
    interval_s: float
    # The node's defaults, for applications that set no retention of their own.
    defaults: Retention
    audit_s: int
    # Tasks (or audit records) deleted per second at most.
    rate: float
    batch: int = PRUNE_BATCH
    audit_batch: int = AUDIT_BATCH
    totals: PruneStats = attrs.field(factory=PruneStats)
    # What every batch deleted so far, added as each commits (``totals`` grows by whole
    # rounds, and a round that catches up on an outage may last many minutes).
    pruned: PruneStats = attrs.field(factory=PruneStats, init=False)
    # Set when the node is shutting down: no batch starts after it.
    stopping: trio.Event | None = None
    # (application id, class) -> how far past its retention the oldest task not yet
    # deleted was at the last batch (0 once a batch found no more than it took).
    _overdue: dict[tuple[str, RetentionClass], float] = attrs.field(factory=dict, init=False)

    log = log
    failure = "retention pass failed"

    @property
    def lag_s(self) -> float:
        """Seconds past its retention of the oldest expired task not yet deleted (as of the
        last batch of each application and class)."""
        return max(self._overdue.values(), default=0.0)

    def _stopped(self) -> bool:
        return self.stopping is not None and self.stopping.is_set()

    def empty_stats(self) -> PruneStats:
        return PruneStats()

    async def one_pass(self) -> PruneStats:
        """A whole round: every application and class until nothing expired is left (or
        the node stops), then the audit records."""
        applications = await self.store.applications(self.defaults)
        known = {(app.application_id, cls) for app in applications for cls in RetentionClass}
        for gone in set(self._overdue) - known:
            del self._overdue[gone]
        total = PruneStats()
        work: list[tuple[ApplicationRetention, RetentionClass]] = [
            (app, cls) for app in applications for cls in RetentionClass
        ]
        while work and not self._stopped():
            more = []
            for app, cls in work:
                if self._stopped():
                    break
                batch = await self._paced(self._tasks(app, cls))
                total = total + batch.stats
                if batch.stats.saturated:
                    more.append((app, cls))
            work = more
        while not self._stopped():
            batch = await self._paced(self.store.prune_audit(self.audit_s, self.audit_batch))
            total = total + batch.stats
            if not batch.stats.saturated:
                break
        return attrs.evolve(total, saturated=False)

    async def _tasks(self, app: ApplicationRetention, cls: RetentionClass) -> Batch:
        batch = await self.store.prune_tasks(app.application_id, cls, app.retention.of(cls), self.batch)
        overdue = batch.overdue_s if batch.stats.saturated and batch.overdue_s is not None else 0.0
        self._overdue[(app.application_id, cls)] = max(overdue, 0.0)
        return batch

    async def _paced(self, work) -> Batch:
        started = trio.current_time()
        batch = await work
        self.pruned = self.pruned + attrs.evolve(batch.stats, saturated=False)
        deleted = batch.stats.tasks + batch.stats.audit
        if deleted:
            elapsed = trio.current_time() - started
            await trio.sleep(max(deleted / self.rate - elapsed, elapsed))
        else:
            await trio.lowlevel.checkpoint()
        return batch

    def report(self, stats: PruneStats) -> None:
        log.info(
            "pruned expired rows: tasks=%d task_attempts=%d idempotency_records=%d audit_records=%d",
            stats.tasks,
            stats.attempts,
            stats.records,
            stats.audit,
        )
