"""The node's dispatch services, built once per node and shared, typed, by everything.

``DispatchServices`` is one frozen value: the node's shards (``Shards``: the database of
ORBIT_MYSQL_DSN and those of ORBIT_SHARDS), each a ``Shard`` with its repositories and,
when the node runs them, its group commit of Worker transitions, claim-turn recorder,
recovery sweeper and plan trigger; and the node-wide fair claim pool and Worker hub,
which reach an application's shard through ``Shards``. The API reads it
(``NodeState.services``); nothing writes into it after it is built, but for the
application ids ``Shards`` learns from verified credentials.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

import attrs
import trio

from .claims import ClaimRequest
from .config import NodeConfig
from .db import Database
from .dispatch.commit import GroupCommitter, concurrent_groups
from .dispatch.plan_trigger import PlanTrigger
from .dispatch.pool import ClaimPool
from .dispatch.recovery import Sweeper
from .dispatch.scheduler import FairScheduler
from .dispatch.signals import SignalRelay
from .dispatch.turns import TurnRecorder
from .dispatch.weights import WeightFollower
from .errors import Unauthenticated, Unavailable
from .metrics import NodeMetrics
from .store.dispatch import DispatchStore
from .store.operations import OperationsStore
from .store.ownership import Reservation
from .store.plans import PlanStore
from .store.signals import SignalStore
from .store.submit_group import SubmitGroups
from .store.tasks import TaskStore
from .store.tenancy import Principal, TenancyStore
from .store.workers import WorkerRegistryStore
from .workers.connection import TransitionStore
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
class Shard:
    """One database holding applications' rows, its repositories, and the services that
    work on it: the group commits of its single submits and of its Worker transitions,
    its claim-turn recorder, the follower of its applications' fairness weights, its
    signals between nodes, its recovery sweeper and its plan trigger. Each transaction
    any of them runs touches this database only."""

    # "main" for ORBIT_MYSQL_DSN, else "shard N" (N from 2, in ORBIT_SHARDS order).
    label: str
    db: Database
    tenancy: TenancyStore
    tasks: TaskStore
    # Single submits through the group commit of acceptances (``store.submit_group``).
    submits: SubmitGroups
    plans: PlanStore
    operations: OperationsStore
    store: DispatchStore
    registry: WorkerRegistryStore
    commits: GroupCommitter | None = None
    turns: TurnRecorder | None = None
    weights: WeightFollower | None = None
    signals: SignalRelay | None = None
    sweeper: Sweeper | None = None
    trigger: PlanTrigger | None = None

    def transitions(self, application_id: str) -> TransitionStore:
        """Where Worker transitions of ``application_id`` go: its lane of this shard's group
        commit (one application per transaction), or the store itself."""
        if self.commits is not None:
            return self.commits.for_application(application_id)
        return self.store


@attrs.define(eq=False)
class Shards:
    """Which shard holds an application: ORBIT_SHARDS by application name, ORBIT_MYSQL_DSN
    for the others (docs/scaling.md).

    A request reaches its shard through its credential: ``authenticate`` looks the token's
    credential up on every shard and keeps the row of the shard the map places its
    application on. The id of every application so verified is remembered, so that what
    carries only an application id (a claim, a Worker's transitions) finds the same shard.
    Without ORBIT_SHARDS every lookup is the main shard, at no cost."""

    main: Shard
    # The databases of ORBIT_SHARDS other than the main one, in order.
    others: tuple[Shard, ...] = ()
    # Application name -> its shard, from ORBIT_SHARDS.
    _by_name: dict[str, Shard] = attrs.field(factory=dict)
    # Application id -> its shard, of every application verified through ``authenticate``.
    _by_id: dict[str, Shard] = attrs.field(factory=dict, init=False)

    @property
    def all(self) -> tuple[Shard, ...]:
        return (self.main, *self.others)

    @property
    def sharded(self) -> bool:
        return bool(self._by_name)

    def of_name(self, application: str) -> Shard:
        """The shard of the application named ``application``."""
        return self._by_name.get(application, self.main)

    def of(self, principal: Principal) -> Shard:
        """The shard of a verified principal's application."""
        if not self._by_name:
            return self.main
        return self.of_name(principal.application)

    def of_application(self, application_id: str) -> Shard:
        """The shard of an application verified through ``authenticate`` (every claim and
        transition comes from a connection whose credential was)."""
        if not self._by_name:
            return self.main
        shard = self._by_id.get(application_id)
        if shard is None:
            raise LookupError(f"application {application_id} has not been verified on this node")
        return shard

    def holds(self, shard: Shard, application_id: str) -> bool:
        """Whether ``application_id`` (verified through ``authenticate``) lives on ``shard``."""
        if not self._by_name:
            return shard is self.main
        return self._by_id.get(application_id) is shard

    async def _verified(self, lookup: Callable[[TenancyStore], Awaitable[Principal]]) -> Principal:
        if not self._by_name:
            return await lookup(self.main.tenancy)
        unavailable: Unavailable | None = None
        for shard in self.all:
            try:
                principal = await lookup(shard.tenancy)
            except Unauthenticated:
                continue
            except Unavailable as exc:
                unavailable = exc
                continue
            # A row on a shard the map does not place its application on (a copy left
            # behind by a move) is not the application's.
            if self.of_name(principal.application) is shard:
                self._by_id[principal.application_id] = shard
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

    # -- what the node-wide claim pool and Worker hub route by application -----------------

    async def claim(self, request: ClaimRequest) -> Sequence[Reservation]:
        return await self.of_application(request.application_id).store.claim(request)

    async def release(self, application_id: str, items: Sequence[tuple[str, str]]) -> object:
        return await self.of_application(application_id).store.release_many(items)

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

    def turns_on(self, shard: Shard, turns: Mapping[str, int]) -> Mapping[str, int]:
        """Of the node's claim turns per application id, those of ``shard``'s applications."""
        if not self._by_name:
            return turns
        return {app: n for app, n in turns.items() if self.holds(shard, app)}


def _turns_of(shards: Callable[[], Shards], index: int, scheduler: FairScheduler) -> Callable[[], Mapping[str, int]]:
    """The claim turns a shard's recorder writes: the node's, of that shard's applications."""

    def turns() -> Mapping[str, int]:
        routed = shards()
        return routed.turns_on(routed.all[index], scheduler.statistics().turns_by_application)

    return turns


def _holds(shards: Callable[[], Shards], index: int) -> Callable[[str], bool]:
    """Whether an application id (verified on this node) lives on the shard at ``index``."""

    def holds(application_id: str) -> bool:
        routed = shards()
        return routed.holds(routed.all[index], application_id)

    return holds


def _known_on(shards: Callable[[], Shards], index: int, scheduler: FairScheduler) -> Callable[[], Collection[str]]:
    """The applications whose turns on other nodes a shard's recorder reads: those of that
    shard the node's rotation knows now (only they can be charged)."""
    holds = _holds(shards, index)

    def applications() -> Collection[str]:
        return [app for app in scheduler.applications() if holds(app)]

    return applications


def shard_labels(config: NodeConfig) -> list[str]:
    """The label of each shard: "main", then "shard 2", "shard 3"... (``config.shard_dsns`` order)."""
    return ["main", *(f"shard {n}" for n in range(2, 2 + len(config.shard_dsns)))]


@attrs.frozen(kw_only=True)
class DispatchServices:
    """The node's shards with their services, and the node-wide ones: ONE fair claim pool
    (fairness rotates applications across every shard) and one Worker hub."""

    shards: Shards
    pool: ClaimPool | None = None
    hub: WorkerHub | None = None

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
    ) -> DispatchServices:
        """``db`` is ORBIT_MYSQL_DSN's database, ``shard_dbs`` one per ``config.shard_dsns``."""
        if len(shard_dbs) != len(config.shard_dsns):
            raise ValueError(f"{len(config.shard_dsns)} shard databases configured, {len(shard_dbs)} given")
        shards: Shards | None = None

        def routed() -> Shards:
            assert shards is not None, "the shards are built before anything runs"
            return shards

        pool = None
        hub: WorkerHub | None = None

        def push_cancel(task_id: str) -> bool:
            return hub is not None and hub.push_cancel(task_id)

        def listening_on(index: int) -> Callable[[], bool]:
            """Whether the node has Worker connections of applications of shard ``index``."""

            def listening() -> bool:
                if hub is None:
                    return False
                routed_shards = routed()
                shard = routed_shards.all[index]
                return any(routed_shards.holds(shard, c.principal.application_id) for c in hub.connections.values())

            return listening

        if run.workers:

            async def claim(request: ClaimRequest) -> Sequence[Reservation]:
                return await routed().claim(request)

            async def release(application_id: str, items: Sequence[tuple[str, str]]) -> object:
                return await routed().release(application_id, items)

            pool = ClaimPool(
                FairScheduler(config.scheduler),
                claim=claim,
                release=release,
                observe=metrics.observe_claim,
                observe_wait=metrics.observe_turn_wait,
            )
        built: list[Shard] = []
        for label, shard_db in zip(shard_labels(config), (db, *shard_dbs), strict=True):
            store = DispatchStore.from_config(shard_db, config)
            tenancy = TenancyStore(shard_db)
            tasks = TaskStore(shard_db)
            operations = OperationsStore(shard_db)
            plans = PlanStore(shard_db)
            commits = turns = weights = signals = sweeper = trigger = None
            if pool is not None:
                commits = GroupCommitter(store, max_concurrent_groups=concurrent_groups(config.scheduler.sql_slots))
                # Claim turns go to the database too: operators see every node's rotation in one place.
                # And the other nodes' turns come back from it: the share across nodes.
                turns = TurnRecorder(
                    operations,
                    node_id,
                    _turns_of(routed, len(built), pool.scheduler),
                    applications=_known_on(routed, len(built), pool.scheduler),
                    charge_elsewhere=pool.scheduler.charge_elsewhere,
                )
                signals = SignalRelay(
                    SignalStore(shard_db),
                    node_id,
                    config.signals,
                    pool=pool,
                    listening=listening_on(len(built)),
                    push_cancel=push_cancel,
                )
                weights = WeightFollower(
                    tenancy.application_weights, pool.scheduler.set_weight, _holds(routed, len(built))
                )
            if run.recovery:
                sweeper = Sweeper(
                    store, config.sweep_interval_s, tasks_arrived=None if signals is None else signals.tasks_arrived
                )
            if run.plans:
                trigger = PlanTrigger(
                    plans,
                    config.plan_interval_s,
                    tasks_arrived=None if signals is None else signals.tasks_arrived,
                )
            built.append(
                Shard(
                    label=label,
                    db=shard_db,
                    tenancy=tenancy,
                    tasks=tasks,
                    submits=SubmitGroups(tasks),
                    plans=plans,
                    operations=operations,
                    store=store,
                    registry=WorkerRegistryStore(shard_db),
                    commits=commits,
                    turns=turns,
                    weights=weights,
                    signals=signals,
                    sweeper=sweeper,
                    trigger=trigger,
                )
            )
        by_location = {dsn.location: shard for dsn, shard in zip(config.shard_dsns, built[1:], strict=True)}
        by_name = {entry.application: by_location.get(entry.dsn.location, built[0]) for entry in config.shards}
        shards = Shards(built[0], tuple(built[1:]), by_name)
        if pool is not None:
            hub = WorkerHub(
                config=config,
                node_id=node_id,
                pool=pool,
                shards=shards,
                shutdown_requested=shutdown_requested,
                on_start=metrics.observe_start,
                on_application=metrics.note_application,
            )
        return cls(shards=shards, pool=pool, hub=hub)

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
        )

    async def run(self, shutdown_requested: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run every built service until cancelled; reports when all have started.

        Phase 1 of shutdown happens here: on ``shutdown_requested`` the pool stops granting
        (pending claims are cancelled, in-flight ones finish and deliver); connections are
        told to drain by their own shutdown watch."""
        async with trio.open_nursery() as nursery:
            for shard in self.shards.all:
                await nursery.start(shard.submits.run)
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
