"""The node's services, built once per node and shared, typed, by everything.

``NodeServices`` is one frozen value: the node's shards (``Shards``: the database of
ORBIT_MYSQL_DSN and those of ORBIT_SHARDS), each a ``Shard`` with its repositories and,
when the node runs them, its group commit of Worker transitions, claim-turn recorder,
recovery sweeper and plan trigger; and the node-wide fair claim pool and Worker hub,
which reach an application's shard through ``Shards``. The API reads it
(``NodeState.services``); nothing writes into it after it is built, but for the
application ids ``Placement`` learns from verified credentials.

``NodeServices.build`` builds bottom-up, so nothing refers to what is not built yet:
``Placement`` (where applications live), each shard's repositories, the claim pool
(routing claims over the repositories, ``StoreRouting``), the table of Worker
connections, each shard's services (over the pool and the table, through the shard's
``ShardView``), and last the Worker hub (over the shards with their services).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime

import attrs
import trio

from .admission.fair import AdmissionGate, FairAdmission
from .admission.submit_rate import RateFollower, SubmitRates
from .config import NodeConfig
from .db import Database
from .dispatch.claim_pool import ClaimPool
from .dispatch.plan_trigger import PlanTrigger
from .dispatch.pruner import Pruner
from .dispatch.recovery import Sweeper
from .dispatch.scheduler import FairScheduler
from .dispatch.signals import SignalRelay
from .dispatch.turns import TurnRecorder
from .dispatch.waits import TaskWaits
from .dispatch.weights import WeightFollower
from .domain.claims import ClaimRequest
from .domain.errors import Unauthenticated, Unavailable
from .domain.ownership import Reservation
from .domain.retention import Retention
from .group_commit.submits import SubmitGroups
from .group_commit.transitions import GroupCommitter, concurrent_groups
from .metrics import NodeMetrics
from .store.actions import CANCEL_REQUESTED, CANCELLED, RETRIED, BulkOutcome
from .store.dependencies import DependencyStore
from .store.leases import LeaseStore
from .store.operations import NODE_STALE_S, OperationsStore
from .store.plans import PlanStore
from .store.pruning import PruneStore
from .store.signals import SignalStore
from .store.tasks import Accepted, TaskStore
from .store.tenancy import Principal, Queue, TenancyStore
from .store.worker_registry import WorkerRegistryStore
from .workers.connection import TransitionStore
from .workers.hub import WorkerHub
from .workers.table import ConnectionTable

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
    # The pruner (retention).
    retention: bool = False


def default_services() -> ServiceSet:
    """What a production node runs: every service."""
    return ServiceSet(workers=True, recovery=True, plans=True, retention=True)


@attrs.frozen(kw_only=True)
class Shard:
    """One database holding applications' rows, its repositories, and the services that
    work on it: the group commits of its single submits and of its Worker transitions,
    its claim-turn recorder, the follower of its applications' fairness weights, its
    signals between nodes, the requests waiting for its tasks to finish, its recovery
    sweeper, its plan trigger and its pruner. Each transaction any of them runs touches
    this database only."""

    # "main" for ORBIT_MYSQL_DSN, else "shard N" (N from 2, in ORBIT_SHARDS order).
    label: str
    db: Database
    tenancy: TenancyStore
    tasks: TaskStore
    # Single submits through the group commit of acceptances (``group_commit.submits``).
    submits: SubmitGroups
    plans: PlanStore
    operations: OperationsStore
    leases: LeaseStore
    registry: WorkerRegistryStore
    # Requests of this node waiting for tasks of this shard to finish (GET /v1/tasks/{id}?wait_s=).
    waits: TaskWaits
    # This node's share of its applications' submit rate limits (``admission/submit_rate.py``), and
    # the follower that keeps them equal to the database's.
    rates: SubmitRates = attrs.field(factory=SubmitRates)
    rate_follower: RateFollower | None = None
    commits: GroupCommitter | None = None
    turns: TurnRecorder | None = None
    weights: WeightFollower | None = None
    signals: SignalRelay | None = None
    sweeper: Sweeper | None = None
    trigger: PlanTrigger | None = None
    pruner: Pruner | None = None

    def transitions(self, application_id: str) -> TransitionStore:
        """Where Worker transitions of ``application_id`` go: its lane of this shard's group
        commit (one application per transaction), or the lease store itself."""
        if self.commits is not None:
            return self.commits.for_application(application_id)
        return self.leases

    # -- what the API and the console do alike: an action, and the wake-up that follows --

    def announce(self, arrivals: Iterable[tuple[str, datetime | None, float | None]]) -> None:
        """Waiting Workers of these queues ((queue, due time or None, seconds after it was
        written)), on this node and the others, may claim at once (or at the due time)
        instead of after their empty-result cache entry expires (a latency shortcut; it
        decides nothing)."""
        if self.signals is not None:
            for queue_id, due_at, due_in_s in dict.fromkeys(arrivals):
                self.signals.tasks_arrived(queue_id, due_at, due_in_s)

    async def retry_task(self, namespace_id: str, task_id: str) -> Accepted:
        """Retry one finished task (a new task linked to it, once) and wake its queue."""
        retried = await self.tasks.retry(namespace_id, task_id)
        if retried.created:
            self.announce([(retried.task.queue_id, None, None)])
        return retried

    async def set_queue_paused(self, namespace_id: str, queue_id: str, paused: bool) -> Queue:
        """Pause or resume a queue; a resumed queue's due tasks may be claimed at once."""
        queue = await self.tenancy.set_queue_paused(namespace_id, queue_id, paused)
        if not paused:
            self.announce([(queue_id, None, None)])
        return queue

    def tasks_finished(self, task_ids: Sequence[str]) -> None:
        """Tasks that finished through this node (a Worker's report, a cancel): the
        requests waiting for them, here and on the other nodes, answer now."""
        self.waits.finished(task_ids)

    def after_cancel(self, task_id: str, state: str) -> None:
        """What a cancel of one task tells the nodes, by the state it left the task in: a
        cancelled task has finished (the requests waiting for it answer); the Worker
        holding a reserved or running one hears of its cancel now, through whichever node
        (at the latest at its next renew)."""
        if state == "cancelled":
            self.tasks_finished([task_id])
        elif state in ("reserved", "running") and self.signals is not None:
            self.signals.cancel(task_id)

    async def update_queue_controls(self, namespace_id: str, queue_id: str, changes: Mapping[str, int | None]) -> Queue:
        """Change a queue's named controls; its due tasks may be claimed at once (a raised
        limit may admit tasks a claim found held back)."""
        queue = await self.tenancy.update_queue_controls(namespace_id, queue_id, changes)
        self.announce([(queue_id, None, None)])
        return queue

    def after_bulk(self, result: BulkOutcome) -> None:
        """What a bulk action's outcomes tell the nodes: the tasks cancelled while queued
        have finished, the Worker holding a task whose cancel was requested hears it now
        (or at its next renew), and the queues of the retried tasks wake."""
        self.tasks_finished([o.task_id for o in result.outcomes if o.outcome == CANCELLED])
        if self.signals is None:
            return
        for outcome in result.outcomes:
            if outcome.outcome == CANCEL_REQUESTED:
                self.signals.cancel(outcome.task_id)
        self.announce(
            (queue_id, None, None) for queue_id in sorted({o.queue_id for o in result.outcomes if o.outcome == RETRIED})
        )


@attrs.define(eq=False)
class Placement:
    """Which shard holds an application, as an index into the node's shards (0: the
    database of ORBIT_MYSQL_DSN, then ``config.shard_dsns`` in order): ORBIT_SHARDS by
    application name, the main one for every other (docs/scaling.md).

    The ids of the applications verified through a credential are remembered with their
    shard, so that what carries only an application id (a claim, a Worker's
    transitions) finds the same one. Without ORBIT_SHARDS every answer is 0, at no cost.
    """

    # Application name -> its shard's index, from ORBIT_SHARDS.
    by_name: Mapping[str, int] = attrs.field(factory=dict)
    # Application id -> its shard's index, of every application verified on this node.
    _by_id: dict[str, int] = attrs.field(factory=dict, init=False)

    @classmethod
    def from_config(cls, config: NodeConfig) -> Placement:
        index = {dsn.location: i for i, dsn in enumerate(config.shard_dsns, start=1)}
        return cls({entry.application: index.get(entry.dsn.location, 0) for entry in config.shards})

    @property
    def sharded(self) -> bool:
        return bool(self.by_name)

    def of_name(self, application: str) -> int:
        return self.by_name.get(application, 0)

    def of_application(self, application_id: str) -> int:
        """The shard of an application verified on this node (every claim and transition
        comes from a connection whose credential was)."""
        if not self.by_name:
            return 0
        index = self._by_id.get(application_id)
        if index is None:
            raise LookupError(f"application {application_id} has not been verified on this node")
        return index

    def remember(self, application_id: str, index: int) -> None:
        self._by_id[application_id] = index

    def holds(self, index: int, application_id: str) -> bool:
        """Whether ``application_id`` (verified on this node) lives on shard ``index``."""
        if not self.by_name:
            return index == 0
        return self._by_id.get(application_id) == index

    def turns_on(self, index: int, turns: Mapping[str, int]) -> Mapping[str, int]:
        """Of the node's claim turns per application id, those of shard ``index``'s applications."""
        if not self.by_name:
            return turns if index == 0 else {}
        return {app: n for app, n in turns.items() if self.holds(index, app)}


@attrs.frozen
class ShardView:
    """One shard's part of the node-wide state, for that shard's services: its
    applications among those the node knows, their claim turns, and whether a Worker of
    one of them is connected here."""

    placement: Placement
    index: int
    scheduler: FairScheduler
    table: ConnectionTable

    def holds(self, application_id: str) -> bool:
        return self.placement.holds(self.index, application_id)

    def turns(self) -> Mapping[str, int]:
        """The claim turns its recorder writes: the node's, of this shard's applications."""
        return self.placement.turns_on(self.index, self.scheduler.statistics().turns_by_application)

    def applications(self) -> Collection[str]:
        """Its applications the node's rotation knows now (the only ones a charge reaches)."""
        return [app for app in self.scheduler.applications() if self.holds(app)]

    def listening(self) -> bool:
        """Whether the node has Worker connections of this shard's applications."""
        return self.table.serves(self.holds)


@attrs.frozen
class StoreRouting:
    """The claim pool's way to an application's lease store."""

    placement: Placement
    leases: Sequence[LeaseStore]

    async def claim(self, request: ClaimRequest) -> Sequence[Reservation]:
        return await self.leases[self.placement.of_application(request.application_id)].claim(request)

    async def release(self, application_id: str, items: Sequence[tuple[str, str]]) -> object:
        return await self.leases[self.placement.of_application(application_id)].release_many(items)


@attrs.frozen
class Shards:
    """The node's shards, each reached by an application's name, a verified principal or
    an application id (``Placement``). A request reaches its shard through its
    credential: ``authenticate`` looks the token's credential up on every shard and keeps
    the row of the shard the map places its application on."""

    placement: Placement
    # Shard 0 is the main one (ORBIT_MYSQL_DSN).
    all: tuple[Shard, ...]

    @property
    def main(self) -> Shard:
        return self.all[0]

    @property
    def sharded(self) -> bool:
        return self.placement.sharded

    def of_name(self, application: str) -> Shard:
        """The shard of the application named ``application``."""
        return self.all[self.placement.of_name(application)]

    def of(self, principal: Principal) -> Shard:
        """The shard of a verified principal's application."""
        return self.of_name(principal.application)

    def of_application(self, application_id: str) -> Shard:
        """The shard of an application verified through ``authenticate``."""
        return self.all[self.placement.of_application(application_id)]

    async def _verified(self, lookup: Callable[[TenancyStore], Awaitable[Principal]]) -> Principal:
        if not self.placement.sharded:
            return await lookup(self.main.tenancy)
        unavailable: Unavailable | None = None
        for index, shard in enumerate(self.all):
            try:
                principal = await lookup(shard.tenancy)
            except Unauthenticated:
                continue
            except Unavailable as exc:
                unavailable = exc
                continue
            # A row on a shard the map does not place its application on (a copy left
            # behind by a move) is not the application's.
            if self.placement.of_name(principal.application) == index:
                self.placement.remember(principal.application_id, index)
                return principal
        if unavailable is not None:
            raise unavailable
        raise Unauthenticated("authorization: unknown or revoked credential", field="authorization")

    async def authenticate(self, token: str | None) -> Principal:
        """The principal of a bearer token (``TenancyStore.authenticate`` on its shard)."""
        return await self._verified(lambda tenancy: tenancy.authenticate(token))

    async def principal_of(self, credential_id: str) -> Principal:
        """The principal of a credential verified before (``TenancyStore.principal_of``)."""
        return await self._verified(lambda tenancy: tenancy.principal_of(credential_id))

    # -- what the Worker hub routes by application ------------------------------------------

    def transitions_for(self, application_id: str) -> TransitionStore:
        return self.of_application(application_id).transitions(application_id)

    def tenancy_for(self, application_id: str) -> TenancyStore:
        return self.of_application(application_id).tenancy

    def registry_for(self, application_id: str) -> WorkerRegistryStore:
        return self.of_application(application_id).registry

    def registries(self) -> Sequence[WorkerRegistryStore]:
        return [shard.registry for shard in self.all]

    def signals_for(self, application_id: str) -> SignalRelay | None:
        return self.of_application(application_id).signals

    def tasks_finished(self, application_id: str, task_ids: Sequence[str]) -> None:
        self.of_application(application_id).tasks_finished(task_ids)


def shard_labels(config: NodeConfig) -> list[str]:
    """The label of each shard: "main", then "shard 2", "shard 3"... (``config.shard_dsns`` order)."""
    return ["main", *(f"shard {n}" for n in range(2, 2 + len(config.shard_dsns)))]


def _shard(
    config: NodeConfig,
    node_id: str,
    run: ServiceSet,
    label: str,
    db: Database,
    leases: LeaseStore,
    placement: Placement,
    index: int,
    pool: ClaimPool | None,
    table: ConnectionTable,
    admission: FairAdmission,
    stopping: trio.Event,
) -> Shard:
    """Shard ``index``: its repositories and the services ``run`` asks for (those of
    Workers only with the claim pool)."""
    tenancy, tasks, operations, plans = TenancyStore(db), TaskStore(db), OperationsStore(db), PlanStore(db)
    commits = turns = weights = signals = sweeper = trigger = pruner = None
    if pool is not None:
        view = ShardView(placement, index, pool.scheduler, table)
        commits = GroupCommitter(leases, max_concurrent_groups=concurrent_groups(config.scheduler.sql_slots))
        # Claim turns go to the database too: operators see every node's rotation in one
        # place. And the other nodes' turns come back from it: the share across nodes.
        turns = TurnRecorder(
            operations,
            node_id,
            view.turns,
            applications=view.applications,
            charge_elsewhere=pool.scheduler.charge_elsewhere,
        )
        signals = SignalRelay(
            SignalStore(db),
            node_id,
            config.signals,
            pool=pool,
            listening=view.listening,
            push_cancel=view.table.push_cancel,
        )
    weights = WeightFollower(
        tenancy.application_weights, _weight_setter(admission, pool), functools.partial(placement.holds, index)
    )
    arrived = None if signals is None else signals.tasks_arrived
    rates = SubmitRates()
    # Every node that serves the API enforces the submit limits, Workers or not.
    rate_follower = RateFollower(lambda: tenancy.submit_limits(NODE_STALE_S), rates)
    if run.recovery:
        sweeper = Sweeper(leases, config.sweep_interval_s, tasks_arrived=arrived, dependencies=DependencyStore(db))
    if run.plans:
        trigger = PlanTrigger(plans, config.plan_interval_s, tasks_arrived=arrived)
    if run.retention:
        pruner = Pruner(
            PruneStore(db),
            config.prune_interval_s,
            defaults=Retention(config.retain_succeeded_s, config.retain_failed_s),
            audit_s=config.retain_audit_s,
            rate=config.prune_rate,
        )
    waits = TaskWaits(tasks, stopping=stopping, signals=signals)
    if signals is not None:
        # The signal reader reads while requests wait, and wakes them with what it hears.
        signals.waiting = waits.any_waiting
        signals.wake_waits = waits.wake
    return Shard(
        label=label,
        db=db,
        tenancy=tenancy,
        tasks=tasks,
        submits=SubmitGroups(tasks),
        plans=plans,
        operations=operations,
        leases=leases,
        registry=WorkerRegistryStore(db),
        waits=waits,
        rates=rates,
        rate_follower=rate_follower,
        commits=commits,
        turns=turns,
        weights=weights,
        signals=signals,
        sweeper=sweeper,
        trigger=trigger,
        pruner=pruner,
    )


def _weight_setter(admission: FairAdmission, pool: ClaimPool | None) -> Callable[[str, int], None]:
    """The fairness weights a shard's follower reads go to the request admission and, on a
    node that serves Workers, to the claim scheduler."""

    def set_weight(application_id: str, weight: int) -> None:
        admission.set_weight(application_id, weight)
        if pool is not None:
            pool.scheduler.set_weight(application_id, weight)

    return set_weight


@attrs.frozen(kw_only=True)
class NodeServices:
    """The node's shards with their services, and the node-wide ones: ONE fair claim pool
    (fairness rotates applications across every shard) and one Worker hub."""

    shards: Shards
    pool: ClaimPool | None = None
    hub: WorkerHub | None = None
    # Fair admission of HTTP requests between applications (``admission/fair.py``).
    admission: AdmissionGate = attrs.field(factory=lambda: AdmissionGate(FairAdmission()))

    @classmethod
    def build(
        cls,
        *,
        config: NodeConfig,
        db: Database,
        shard_dbs: Sequence[Database] = (),
        node_id: str,
        metrics: NodeMetrics,
        shutdown_requested: trio.Event,
        run: ServiceSet,
    ) -> NodeServices:
        """``db`` is ORBIT_MYSQL_DSN's database, ``shard_dbs`` one per ``config.shard_dsns``.

        Built bottom-up: where applications live, each shard's repositories, the claim
        pool (over the repositories), the table of Worker connections, each shard's
        services (over the pool and the table), and last the Worker hub (over the shards
        with their services)."""
        if len(shard_dbs) != len(config.shard_dsns):
            raise ValueError(f"{len(config.shard_dsns)} shard databases configured, {len(shard_dbs)} given")
        placement = Placement.from_config(config)
        databases = (db, *shard_dbs)
        leases = [LeaseStore.from_config(shard_db, config) for shard_db in databases]
        pool: ClaimPool | None = None
        table = ConnectionTable()
        admission = FairAdmission(config.admission)
        if run.workers:
            routing = StoreRouting(placement, leases)
            pool = ClaimPool(
                FairScheduler(config.scheduler),
                claim=routing.claim,
                release=routing.release,
                observe=metrics.observe_claim,
                observe_wait=metrics.observe_turn_wait,
            )
        labels = shard_labels(config)
        shards = Shards(
            placement,
            tuple(
                _shard(
                    config,
                    node_id,
                    run,
                    labels[i],
                    databases[i],
                    leases[i],
                    placement,
                    i,
                    pool,
                    table,
                    admission,
                    shutdown_requested,
                )
                for i in range(len(databases))
            ),
        )
        hub = None
        if pool is not None:
            hub = WorkerHub(
                config=config,
                node_id=node_id,
                pool=pool,
                shards=shards,
                shutdown_requested=shutdown_requested,
                on_start=metrics.observe_start,
                on_application=metrics.note_application,
                table=table,
            )
        gate = AdmissionGate(
            admission, observe_wait=metrics.observe_admission_wait, observe_refused=metrics.observe_admission_refused
        )
        return cls(shards=shards, pool=pool, hub=hub, admission=gate)

    def report_to(self, metrics: NodeMetrics) -> None:
        """Let ``metrics`` read these services' figures at scrape time."""
        shards = self.shards.all
        metrics.collect_from(
            hub=self.hub,
            pool=self.pool,
            sweepers=[s.sweeper for s in shards if s.sweeper is not None],
            commits=[s.commits for s in shards if s.commits is not None],
            databases=[s.db for s in shards],
            signals=[s.signals for s in shards if s.signals is not None],
            pruners=[s.pruner for s in shards if s.pruner is not None],
            waits=[s.waits for s in shards],
        )

    async def run(self, shutdown_requested: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run every built service until cancelled; reports when all have started.

        Phase 1 of shutdown happens here: on ``shutdown_requested`` the pool stops granting
        (pending claims are cancelled, in-flight ones finish and deliver); connections are
        told to drain by their own shutdown watch."""
        async with trio.open_nursery() as nursery:
            for shard in self.shards.all:
                await nursery.start(shard.submits.run)
                await nursery.start(shard.waits.run)
                if shard.rate_follower is not None:
                    await nursery.start(shard.rate_follower.run)
                if shard.commits is not None:
                    await nursery.start(shard.commits.run)
            if self.pool is not None:
                await nursery.start(self.pool.run)
            if self.hub is not None:
                nursery.start_soon(self.hub.run)
            for shard in self.shards.all:
                if shard.turns is not None:
                    await nursery.start(shard.turns.run)
                if shard.weights is not None:
                    await nursery.start(shard.weights.run)
                if shard.signals is not None:
                    await nursery.start(shard.signals.run)
                if shard.sweeper is not None:
                    await nursery.start(shard.sweeper.run)
                if shard.trigger is not None:
                    await nursery.start(shard.trigger.run)
                if shard.pruner is not None:
                    # It stops between batches once shutdown is asked for.
                    shard.pruner.stopping = shutdown_requested
                    await nursery.start(shard.pruner.run)
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
