"""The trio side of the fair claim pool: runs the scheduler's grants as claim SQL.

The decisions are ``FairScheduler``'s (pure); this adapter only awaits. Connections
hand in one ``ClaimRequest`` with a ``deliver`` callback and go on serving their
Worker: the control loop never waits on claim SQL. Each grant runs in this pool's
own nursery; its result goes to ``deliver``. If the connection left meanwhile, the
reservations are given back at once (``release``) instead of waiting for their lease.

Shutdown (``close()``): pending requests are cancelled (their ``deliver`` gets
``PoolClosed``), no new grants are made, in-flight claims finish and deliver.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from ..domain.claims import ClaimRequest
from ..domain.ownership import Reservation
from .scheduler import FairScheduler, Grant

log = logging.getLogger("orbit.claims")

Deliver = Callable[[Sequence[Reservation] | BaseException], None]


class PoolClosed(Exception):
    """The node is shutting down; no more claims."""


@attrs.frozen
class ClaimPoolStatistics:
    claims_with_tasks: int
    claims_empty: int
    claims_failed: int
    tasks_reserved: int
    cached_empty_skips: int
    pending: int
    in_flight: int
    turns_by_application: dict[str, int]
    # Rounds of the pool's loop (each one a grant decision); a figure for busy-loop checks.
    rounds: int


@attrs.define(eq=False)
class ClaimPool:
    scheduler: FairScheduler
    # Runs the claim SQL (``LeaseStore.claim``); returns the reservations.
    claim: Callable[[ClaimRequest], Awaitable[Sequence[Reservation]]]
    # Gives an application's (task_id, token) reservations back when their connection is
    # gone (``LeaseStore.release_many`` of the application's shard).
    release: Callable[[str, Sequence[tuple[str, str]]], Awaitable[object]]
    # Called with (grant, outcome, seconds) after each claim: metrics hook.
    observe: Callable[[Grant, str, float], None] | None = None
    # Called with each grant as it is made, in fairness order (metrics: claim turns).
    on_grant: Callable[[Grant], None] | None = None
    # Called with each request the scheduler accepted.
    on_request: Callable[[ClaimRequest], None] | None = None
    # Called with each grant and how long its request waited for it (trio's clock, from
    # ``request`` to the grant): metrics hook.
    observe_wait: Callable[[Grant, float], None] | None = None
    _deliver: dict[str, Deliver] = attrs.field(factory=dict, init=False)
    # Per connection with a request waiting for its turn: when it was accepted (trio's clock).
    _submitted: dict[str, float] = attrs.field(factory=dict, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Set when ``run`` has returned: closed, every in-flight claim finished and delivered
    # (or its reservations given back).
    _drained: trio.Event = attrs.field(factory=trio.Event, init=False)
    _rounds: int = attrs.field(default=0, init=False)
    _counts: dict[str, int] = attrs.field(
        factory=lambda: {"tasks": 0, "empty": 0, "error": 0, "reserved": 0}, init=False
    )

    # -- called by connections (synchronous, never blocks) ---------------------------------

    def request(self, request: ClaimRequest, deliver: Deliver) -> None:
        """Queue one claim request; raises ``SchedulerRefused`` or ``PoolClosed``."""
        if self._closed:
            raise PoolClosed("node is shutting down")
        self.scheduler.submit(request)
        self._submitted[request.connection_id] = trio.current_time()
        self._deliver[request.connection_id] = deliver
        if self.on_request is not None:
            self.on_request(request)
        self._changed.set()

    def widen(self, connection_id: str, limit: int) -> None:
        """Raise the limit of the connection's waiting request (``FairScheduler.widen``)."""
        self.scheduler.widen(connection_id, limit)

    def leave(self, connection_id: str) -> None:
        """The connection is gone: drop its pending request; in-flight results get released."""
        self.scheduler.forget_connection(connection_id)
        self._deliver.pop(connection_id, None)
        self._submitted.pop(connection_id, None)
        self._changed.set()

    def task_arrived(self, queue_id: str) -> None:
        """Tasks are due in ``queue_id`` (accepted or requeued through this node, or heard
        of from another): wake its waiting requests."""
        self.scheduler.task_arrived(queue_id)
        self._changed.set()

    def task_due(self, queue_id: str, when: float) -> None:
        """A task of ``queue_id`` comes due at ``when`` (trio's clock): wake its waiting
        requests then, rather than when their empty results expire."""
        self.scheduler.cache.forget_queue_at(queue_id, when)
        self._changed.set()

    def close(self) -> None:
        """Stop granting; cancel pending requests. In-flight claims still finish."""
        self._closed = True
        for request in self.scheduler.withdraw_all():
            self._submitted.pop(request.connection_id, None)
            deliver = self._deliver.pop(request.connection_id, None)
            if deliver is not None:
                deliver(PoolClosed("node is shutting down"))
        self._changed.set()

    # -- the service -------------------------------------------------------------------

    async def wait_drained(self) -> None:
        """Return once the pool is closed and its last in-flight claim has been delivered."""
        await self._drained.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Grant claims until closed and every in-flight claim has finished."""
        try:
            await self._run(task_status)
        finally:
            self._drained.set()

    async def _run(self, task_status) -> None:
        async with trio.open_nursery() as claims:
            task_status.started()
            while True:
                self._rounds += 1
                now = trio.current_time()
                for queue_id in self.scheduler.cache.due_queues(now):
                    self.scheduler.task_arrived(queue_id)
                if not self._closed:
                    for grant in self.scheduler.grant(now):
                        submitted = self._submitted.pop(grant.request.connection_id, now)
                        if self.observe_wait is not None:
                            self.observe_wait(grant, now - submitted)
                        if self.on_grant is not None:
                            self.on_grant(grant)
                        claims.start_soon(self._run_claim, grant)
                if self._closed and self.scheduler.statistics().in_flight == 0:
                    return
                wakeup = math.inf
                if not self._closed:
                    times = (self.scheduler.next_wakeup(now), self.scheduler.cache.next_due())
                    wakeup = min((t for t in times if t is not None), default=math.inf)
                self._changed = trio.Event()
                with trio.move_on_at(wakeup):
                    await self._changed.wait()

    async def _run_claim(self, grant: Grant) -> None:
        started = trio.current_time()
        # result is what the connection is given: the reservations, or the error (reservations then stay empty).
        reservations: Sequence[Reservation] = ()
        result: Sequence[Reservation] | BaseException
        try:
            result = reservations = await self.claim(grant.claim)
            outcome = "tasks" if reservations else "empty"
        except Exception as exc:  # the database may be down: the connection retries later
            log.warning(
                "claim failed for connection %s: %s",
                grant.request.connection_id,
                exc,
                extra={
                    "connection_id": grant.request.connection_id,
                    "application_id": grant.request.application_id,
                    "queue_id": grant.queue_id,
                },
            )
            result, outcome = exc, "error"
        except BaseException:
            self.scheduler.complete(grant, trio.current_time(), empty=False)
            self._changed.set()
            raise
        now = trio.current_time()
        # A claim that took fewer tasks than it asked for has found the queue empty behind
        # them (it reads past rows other claims hold): remembered like an empty result, so
        # the connection's next request (right after this delivery, or after its Finish)
        # spends no grant of its pace and no SQL until a task arrives or the cycle ends.
        exhausted = outcome != "error" and len(reservations) < grant.claim.limit
        self.scheduler.complete(grant, now, empty=exhausted)
        self._changed.set()
        self._counts[outcome] += 1
        if outcome == "tasks":
            self._counts["reserved"] += len(reservations)
        if self.observe is not None:
            self.observe(grant, outcome, now - started)
        deliver = self._deliver.pop(grant.request.connection_id, None)
        if deliver is not None:
            deliver(result)
        elif outcome == "tasks":
            # The connection left while its claim ran: give the reservations back now.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await self.release(
                        grant.request.application_id, [(r.task_id, r.fencing_token) for r in reservations]
                    )
                except Exception as exc:
                    log.warning(
                        "could not release %d reservations of a closed connection (lease recovery will): %s",
                        len(reservations),
                        exc,
                    )

    def statistics(self) -> ClaimPoolStatistics:
        s = self.scheduler.statistics()
        return ClaimPoolStatistics(
            claims_with_tasks=self._counts["tasks"],
            claims_empty=self._counts["empty"],
            claims_failed=self._counts["error"],
            tasks_reserved=self._counts["reserved"],
            cached_empty_skips=s.cached_empty_skips,
            pending=s.pending,
            in_flight=s.in_flight,
            turns_by_application=s.turns_by_application,
            rounds=self._rounds,
        )
