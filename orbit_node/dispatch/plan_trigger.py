"""The plan trigger: a node service that turns due fire times into tasks.

Every node runs one; any number may run at once. A pass reads the plans due on the
database clock (no locks), then fires each in its own short transaction that locks the
plan ``FOR UPDATE SKIP LOCKED``: a plan another node is firing is simply skipped, and the
fire records make a second task for one fire time impossible anyway. The trio clock only
paces the passes; it never decides what is due.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import attrs

from .periodic import PeriodicService

log = logging.getLogger("orbit.plans")

# Plans read per pass; each is fired in its own transaction.
PLANS_PER_PASS = 64
# Fire times one transaction creates at most for one plan; a plan with more due fire
# times stays due and is fired again in the next pass, which then runs at once.
FIRES_PER_TRANSACTION = 100


class FireStore(Protocol):
    """What the trigger needs of ``store.plans.PlanStore``."""

    async def due(self, limit: int) -> list[str]: ...

    async def fire(self, plan_id: str, *, limit: int): ...


@attrs.frozen
class PassStats:
    plans_fired: int = 0
    tasks_created: int = 0
    # Another node (or an API writer) held the plan, or it was no longer due.
    plans_skipped: int = 0
    # There is more to do right away (a full candidate batch, or a plan still due).
    saturated: bool = False

    def __add__(self, other: PassStats) -> PassStats:
        return PassStats(
            self.plans_fired + other.plans_fired,
            self.tasks_created + other.tasks_created,
            self.plans_skipped + other.plans_skipped,
            other.saturated,
        )


@attrs.define(eq=False)
class PlanTrigger(PeriodicService):
    store: FireStore
    interval_s: float
    plans_per_pass: int = PLANS_PER_PASS
    fires_per_transaction: int = FIRES_PER_TRANSACTION
    totals: PassStats = attrs.field(factory=PassStats)
    # Called with the queue id of each fire that created tasks, once committed (the claim
    # pool's ``task_arrived``: this node's waiting Workers of that queue ask at once).
    tasks_arrived: Callable[[str], None] | None = None

    log = log
    # Fire times that became more than grace_s late while the database was unreachable
    # are caught up by the next round.
    failure = "plan trigger failed"

    def empty_stats(self) -> PassStats:
        return PassStats()

    async def one_pass(self) -> PassStats:
        return await self.trigger_once()

    def report(self, stats: PassStats) -> None:
        if stats.tasks_created:
            log.info("plans fired: plans=%d tasks=%d", stats.plans_fired, stats.tasks_created)

    async def trigger_once(self) -> PassStats:
        """One pass: fire every plan that is due now (each in its own transaction)."""
        stats = PassStats()
        due = await self.store.due(self.plans_per_pass)
        for plan_id in due:
            result = await self.store.fire(plan_id, limit=self.fires_per_transaction)
            if not result.locked:
                stats = attrs.evolve(stats, plans_skipped=stats.plans_skipped + 1)
                continue
            if result.stopped:
                log.error("plan %s stopped firing: %s", plan_id, result.stopped)
            if result.created and result.queue_id is not None and self.tasks_arrived is not None:
                self.tasks_arrived(result.queue_id)
            stats = attrs.evolve(
                stats,
                plans_fired=stats.plans_fired + 1,
                tasks_created=stats.tasks_created + result.created,
                saturated=stats.saturated or result.still_due,
            )
        if len(due) >= self.plans_per_pass:
            stats = attrs.evolve(stats, saturated=True)
        return stats

    async def trigger(self) -> PassStats:
        """Passes until one is not saturated (bounded); returns what they did together."""
        return await self.run_round()
