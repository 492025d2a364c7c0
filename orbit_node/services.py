"""The node's dispatch services, built once per node and shared, typed, by everything.

``DispatchServices`` is one frozen value: the node's one ``DispatchStore`` and, when the
node runs them, the group commit of Worker transitions, the fair claim pool, the Worker hub, the claim-turn recorder, the
recovery sweeper and the plan trigger. The API reads it (``NodeState.services``);
nothing writes into it after it is built.
"""

from __future__ import annotations

import logging

import attrs
import trio

from .config import NodeConfig
from .db import Database
from .dispatch.commit import GroupCommitter
from .dispatch.plan_trigger import PlanTrigger
from .dispatch.pool import ClaimPool
from .dispatch.recovery import Sweeper
from .dispatch.scheduler import FairScheduler
from .dispatch.turns import TurnRecorder
from .metrics import NodeMetrics
from .store.dispatch import DispatchStore
from .store.operations import OperationsStore
from .store.plans import PlanStore
from .store.tenancy import TenancyStore
from .store.workers import WorkerRegistryStore
from .workers.hub import WorkerHub

log = logging.getLogger("orbit.node")


@attrs.frozen(kw_only=True)
class ServiceSet:
    """Which background services a node runs beside HTTP (a bare node, in tests, runs none)."""

    # The fair claim pool, the Worker hub and the claim-turn recorder.
    workers: bool = False
    # The recovery sweeper.
    recovery: bool = False
    # The plan trigger.
    plans: bool = False


def default_services() -> ServiceSet:
    """What a production node runs: every service."""
    return ServiceSet(workers=True, recovery=True, plans=True)


@attrs.frozen(kw_only=True)
class DispatchServices:
    store: DispatchStore
    # The group commit of Worker transitions (Start/renew/Finish/release).
    commits: GroupCommitter | None = None
    pool: ClaimPool | None = None
    hub: WorkerHub | None = None
    turns: TurnRecorder | None = None
    sweeper: Sweeper | None = None
    plans: PlanTrigger | None = None

    @classmethod
    def build(
        cls,
        *,
        config: NodeConfig,
        db: Database,
        node_id: str,
        tenancy: TenancyStore,
        metrics: NodeMetrics,
        shutdown_requested: trio.Event,
        run: ServiceSet,
    ) -> DispatchServices:
        store = DispatchStore.from_config(db, config)
        commits = pool = hub = turns = sweeper = plans = None
        if run.workers:
            commits = GroupCommitter(store)
            pool = ClaimPool(
                FairScheduler(config.scheduler),
                claim=store.claim,
                release=store.release_many,
                observe=metrics.observe_claim,
            )
            hub = WorkerHub(
                config=config,
                node_id=node_id,
                store=commits,
                pool=pool,
                tenancy=tenancy,
                registry=WorkerRegistryStore(db),
                shutdown_requested=shutdown_requested,
                on_start=metrics.observe_start,
                on_application=metrics.note_application,
            )
            # Claim turns go to the database too: operators see every node's rotation in one place.
            scheduler = pool.scheduler
            turns = TurnRecorder(OperationsStore(db), node_id, lambda: scheduler.statistics().turns_by_application)
        if run.recovery:
            sweeper = Sweeper(store, config.sweep_interval_s)
        if run.plans:
            plans = PlanTrigger(
                PlanStore(db), config.plan_interval_s, tasks_arrived=None if pool is None else pool.task_arrived
            )
        metrics.collect_from(hub=hub, pool=pool, sweeper=sweeper, commits=commits)
        return cls(store=store, commits=commits, pool=pool, hub=hub, turns=turns, sweeper=sweeper, plans=plans)

    async def run(self, shutdown_requested: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run every built service until cancelled; reports when all have started.

        Phase 1 of shutdown happens here: on ``shutdown_requested`` the pool stops granting
        (pending claims are cancelled, in-flight ones finish and deliver); connections are
        told to drain by their own shutdown watch."""
        async with trio.open_nursery() as nursery:
            if self.commits is not None:
                await nursery.start(self.commits.run)
            if self.pool is not None:
                await nursery.start(self.pool.run)
            if self.hub is not None:
                nursery.start_soon(self.hub.run)
            if self.turns is not None:
                await nursery.start(self.turns.run)
            if self.sweeper is not None:
                await nursery.start(self.sweeper.run)
            if self.plans is not None:
                await nursery.start(self.plans.run)
            task_status.started()
            if self.pool is not None:
                await shutdown_requested.wait()
                self.pool.close()

    async def drain(self, deadline: float) -> None:
        """Phase 2 of shutdown, once HTTP has stopped: wait (until ``deadline`` on trio's clock)
        for the claims still in flight to finish. Each delivers to its connection or, the
        connection being gone, gives its reservations back at once; only what a claim
        committed and could not give back is left to lease recovery."""
        if self.pool is None:
            return
        in_flight = self.pool.statistics().in_flight
        if in_flight:
            log.info("shutdown: waiting for %d in-flight claims to finish", in_flight)
        with trio.move_on_at(deadline) as waited:
            await self.pool.wait_drained()
        if waited.cancelled_caught:
            log.warning(
                "shutdown: %d claims still in flight at the end of the grace period (lease recovery takes them)",
                self.pool.statistics().in_flight,
            )
