"""The node-wide fair claim scheduler (P3 section 3), as a pure state machine.

No I/O and no clock of its own: every decision takes ``now`` (trio's clock in the
node) and returns what to do. The trio adapter (``claim_pool.py``) does the awaiting.

Limits (``SchedulerLimits``, development baseline):
* at most ``sql_slots`` claims in flight per node (4);
* at most ``in_flight_per_application`` in-flight claims per application (1);
* at most ``max_requests`` pending + in-flight requests per node (128);
* at most one outstanding request per connection (P3: fixed, not a setting; requests
  are keyed by connection);
* at most ``claims_per_connection_per_cycle`` grants per connection per scan cycle (4 per 1 s),
  spread over the cycle by a token bucket of the same rate (``pace.py``).

Selection order: rotate the active applications -> rotate that application's queues
-> request order of connections inside the queue. A request that serves several
queues waits in the line of each and is granted at whichever queue's turn comes
first (then leaves every line). The application is the server-side owner of the
connection's namespace.

"Whose turn" is decided by virtual time (start-time fair queueing, ``Rotation``):
each turn advances the application's virtual time by ``1 / weight``, and the next
turn goes to the eligible application with the smallest one (ties: whoever has
waited longest). An application that is skipped (its in-flight claim is still
running, or nothing of it is eligible) keeps its place. One that leaves (no request
waiting, no claim running) and comes back resumes at ``max(its own virtual time, the
node's virtual time)``: a gap shorter than a round costs it nothing, and a long idle
period earns it no credit. The queues of one application rotate the same way, at
weight 1. So an application with 10 queues and 40 connections gets no more turns
than one with 1 queue and 1 connection while both ask, even when the small one's
connection pauses between its claims; with weights, turns follow the weights.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping

import attrs

from ..config import SchedulerLimits
from ..domain.claims import ClaimRequest
from .cache import CacheKey, EmptyResultCache
from .pace import Pace, Pacing
from .rotation import TURN, Rotation, check_weight


class SchedulerRefused(Exception):
    """A request the scheduler will not take now; the connection may ask again later."""


class SchedulerFull(SchedulerRefused):
    """The node already holds ``max_requests`` pending + in-flight requests."""


class AlreadyOutstanding(SchedulerRefused):
    """The connection already has its one outstanding request."""


def cache_key(request: ClaimRequest, queue_id: str) -> CacheKey:
    """The empty-result cache entry a claim of ``request`` in ``queue_id`` would fill."""
    return CacheKey(request.namespace_id, queue_id, request.capabilities, request.resource_key_support)


@attrs.frozen
class Grant:
    """Permission to run one claim for ``request`` in ``queue_id`` now."""

    request: ClaimRequest
    queue_id: str

    @property
    def claim(self) -> ClaimRequest:
        """The claim to run: the request narrowed to the granted queue."""
        return self.request.for_queue(self.queue_id)


@attrs.frozen
class SchedulerStatistics:
    pending: int
    in_flight: int
    active_applications: int
    turns_by_application: dict[str, int]
    max_in_flight_seen: int
    max_application_in_flight_seen: int
    max_requests_seen: int
    cached_empty_skips: int
    refused: int
    # Connections with a pacing record (bounded by the live and in-flight connections).
    tracked_connections: int = 0
    # The node's virtual time (in turns at weight 1): where the latest turn started.
    virtual_time: float = 0.0
    # Per application in the rotation or remembered by it: the virtual time its next turn
    # would start at, and its weight.
    virtual_time_by_application: dict[str, float] = attrs.Factory(dict)
    weight_by_application: dict[str, int] = attrs.Factory(dict)


def _default_cache(scheduler: FairScheduler) -> EmptyResultCache:
    return EmptyResultCache(scheduler.limits.scan_cycle_s, scheduler.limits.empty_cache_entries)


@attrs.define(eq=False)
class FairScheduler:
    limits: SchedulerLimits
    cache: EmptyResultCache = attrs.field(default=attrs.Factory(_default_cache, takes_self=True))
    _pending: dict[str, ClaimRequest] = attrs.field(factory=dict, init=False)
    _in_flight: dict[str, Grant] = attrs.field(factory=dict, init=False)
    _app_in_flight: Counter[str] = attrs.field(factory=Counter, init=False)
    # Applications with a waiting request or a running claim (members), and those that left
    # about a round ago (remembered), in virtual time.
    _apps: Rotation = attrs.field(factory=Rotation, init=False)
    # Per application known to ``_apps``: its queues, members while they have a waiting
    # request, one turn costing ``TURN`` (the queues of an application have no weights).
    _app_queues: dict[str, Rotation] = attrs.field(factory=dict, init=False)
    # Fairness weights other than 1 (``set_weight``).
    _weights: dict[str, int] = attrs.field(factory=dict, init=False)
    # Per queue: waiting connections in request order.
    _lines: dict[str, OrderedDict[str, None]] = attrs.field(factory=dict, init=False)
    # The claim pace of a connection, and each connection's record of it.
    pacing: Pacing = attrs.field(
        default=attrs.Factory(
            lambda self: Pacing(self.limits.claims_per_connection_per_cycle, self.limits.scan_cycle_s), takes_self=True
        ),
        init=False,
    )
    _paces: dict[str, Pace] = attrs.field(factory=dict, init=False)
    # Connections that left while their claim ran: their pacing record goes when it completes.
    # A subset of ``_in_flight``'s keys, so bounded by the SQL slots.
    _departed: set[str] = attrs.field(factory=set, init=False)
    # In-flight claims that a task arrival overtook: an empty result they return may predate
    # the new task's commit, so it is not remembered. Also a subset of ``_in_flight``'s keys.
    _overtaken: set[str] = attrs.field(factory=set, init=False)
    _turns: Counter[str] = attrs.field(factory=Counter, init=False)
    _max_in_flight: int = attrs.field(default=0, init=False)
    _max_app_in_flight: int = attrs.field(default=0, init=False)
    _max_requests: int = attrs.field(default=0, init=False)
    _cached_skips: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)

    # -- weights -----------------------------------------------------------------------

    def set_weight(self, application_id: str, weight: int) -> None:
        """The application's fairness weight, 1 to 100 (default 1): with every application
        asking, turns are shared in proportion to the weights. Takes effect from its next
        turn; its place now does not move."""
        if check_weight(weight) == 1:
            self._weights.pop(application_id, None)
        else:
            self._weights[application_id] = weight

    def weight(self, application_id: str) -> int:
        return self._weights.get(application_id, 1)

    def charge(self, application_id: str, turns: int) -> None:
        """Count ``turns`` the application took elsewhere as if taken here: its virtual time
        moves ``turns / weight`` later, so it waits that much longer for its next turn.

        The hook for a share across nodes (turns taken on other nodes). An application
        this node neither serves nor remembers is not charged: it starts at the node's
        virtual time when it comes anyway."""
        if turns < 0:
            raise ValueError(f"turns must not be negative, got {turns!r}")
        self._apps.charge(application_id, turns * (TURN // self.weight(application_id)))

    def applications(self) -> list[str]:
        """The applications in the rotation or remembered by it: those a charge reaches."""
        return list(self._apps.times())

    def charge_elsewhere(self, turns: Mapping[str, int]) -> None:
        """The share across nodes: ``turns`` are the claim turns each application took on
        the cluster's other nodes since the previous call (once a scan cycle). Each counts
        as taken here, as with ``charge``, but an application ends at most those turns plus
        one ahead of the node's virtual time: a lead left from earlier calls that the node
        has not caught up with yet is dropped. So turns taken elsewhere delay an application
        here by at most one call's worth, and only while others ask: like every charge,
        this orders turns and never withholds one (an application that alone asks is
        granted). Applications this node neither serves nor remembers are left out."""
        for application_id, n in turns.items():
            if n < 0:
                raise ValueError(f"turns must not be negative, got {n!r} for {application_id}")
            if n:
                unit = TURN // self.weight(application_id)
                self._apps.charge(application_id, n * unit, lead_at_most=(n + 1) * unit)

    # -- requests ----------------------------------------------------------------------

    def outstanding(self, connection_id: str) -> bool:
        return connection_id in self._pending or connection_id in self._in_flight

    def submit(self, request: ClaimRequest) -> None:
        """Queue a connection's request; raises ``SchedulerRefused`` when a limit says no."""
        if not request.queue_ids:
            raise ValueError("a claim request needs at least one queue")
        if self.outstanding(request.connection_id):
            self._refused += 1
            raise AlreadyOutstanding(request.connection_id)
        if len(self._pending) + len(self._in_flight) >= self.limits.max_requests:
            self._refused += 1
            raise SchedulerFull(f"{self.limits.max_requests} claim requests already held")
        self._pending[request.connection_id] = request
        self._apps.join(request.application_id)
        app_queues = self._app_queues.setdefault(request.application_id, Rotation())
        for queue_id in dict.fromkeys(request.queue_ids):
            self._lines.setdefault(queue_id, OrderedDict())[request.connection_id] = None
            app_queues.join(queue_id)
        self._max_requests = max(self._max_requests, len(self._pending) + len(self._in_flight))

    def widen(self, connection_id: str, limit: int) -> bool:
        """Raise the limit of a connection's request that still waits for its turn (its
        Worker freed capacity meanwhile). Its place in line does not change; a request
        already running, or none, is left alone (False)."""
        request = self._pending.get(connection_id)
        if request is None or limit <= request.limit:
            return False
        self._pending[connection_id] = attrs.evolve(request, limit=limit)
        return True

    def withdraw(self, connection_id: str) -> ClaimRequest | None:
        """Drop a connection's pending request (connection closed). In-flight claims finish normally."""
        request = self._pending.pop(connection_id, None)
        if request is not None:
            self._leave_lines(request)
        return request

    def withdraw_all(self) -> list[ClaimRequest]:
        """Drop every pending request (node shutting down)."""
        return [t for t in (self.withdraw(c) for c in list(self._pending)) if t is not None]

    def _leave_lines(self, request: ClaimRequest) -> None:
        app_queues = self._app_queues[request.application_id]
        for queue_id in dict.fromkeys(request.queue_ids):
            line = self._lines.get(queue_id)
            if line is None:
                continue
            line.pop(request.connection_id, None)
            if not line:
                del self._lines[queue_id]
                app_queues.leave(queue_id)
        self._leave_if_idle(request.application_id)

    def _leave_if_idle(self, app_id: str) -> None:
        """Nothing waiting and nothing running: out of the rotation. An application whose
        claim runs keeps its place, whether or not it has other requests waiting."""
        if self._app_queues[app_id] or self._app_in_flight[app_id]:
            return
        if self._apps.leave(app_id):
            del self._app_queues[app_id]

    # -- decisions ---------------------------------------------------------------------

    def _paced_out(self, connection_id: str, now: float) -> bool:
        return not self.pacing.allows(self._paces.get(connection_id), now)

    def _pick(self, now: float, held: set[str]) -> Grant | None:
        """The first grantable request in fairness order. Applications passed over because
        a rule of P3 holds them back (their claim in flight, their connections paced out)
        are added to ``held``: they keep their place in virtual time."""
        for app_id in self._apps.order():
            if self._app_in_flight[app_id] >= self.limits.in_flight_per_application:
                if self._app_queues[app_id]:
                    held.add(app_id)
                continue
            picked = self._pick_in(app_id, now, held)
            if picked is not None:
                return picked
        return None

    def _pick_in(self, app_id: str, now: float, held: set[str]) -> Grant | None:
        """The first grantable request of one application, in its queue rotation."""
        for queue_id in self._app_queues[app_id].order():
            for connection_id in self._lines[queue_id]:
                request = self._pending[connection_id]
                if self._paced_out(connection_id, now):
                    held.add(app_id)
                    continue
                if self.cache.is_empty(cache_key(request, queue_id), now, count=False):
                    self._cached_skips += 1
                    continue
                return Grant(request, queue_id)
        return None

    def grant(self, now: float) -> list[Grant]:
        """Every claim that may start now, in fairness order."""
        grants = []
        while len(self._in_flight) < self.limits.sql_slots:
            held: set[str] = set()
            grant = self._pick(now, held)
            if grant is None:
                break
            request = grant.request
            app_id = request.application_id
            # The granted application and queue move on in virtual time; those passed over
            # only because P3's rules held them back keep their place.
            for forgotten in self._apps.served(app_id, TURN // self.weight(app_id), held=held):
                del self._app_queues[forgotten]
            self._app_queues[app_id].served(grant.queue_id, TURN)
            del self._pending[request.connection_id]
            self._in_flight[request.connection_id] = grant
            self._app_in_flight[app_id] += 1
            # In flight before it leaves the lines: the application keeps its place in the
            # rotation while its claim runs, whether or not it has other requests waiting.
            self._leave_lines(request)
            self._paces[request.connection_id] = self.pacing.granted(self._paces.get(request.connection_id), now)
            self._turns[app_id] += 1
            self._max_in_flight = max(self._max_in_flight, len(self._in_flight))
            self._max_app_in_flight = max(self._max_app_in_flight, self._app_in_flight[app_id])
            grants.append(grant)
        return grants

    def complete(self, grant: Grant, now: float, *, empty: bool) -> None:
        """A granted claim finished; an empty result is remembered for one scan cycle."""
        request = grant.request
        if self._in_flight.get(request.connection_id) is not grant:
            raise ValueError(f"no in-flight claim {grant!r}")
        del self._in_flight[request.connection_id]
        self._app_in_flight[request.application_id] -= 1
        if not self._app_in_flight[request.application_id]:
            del self._app_in_flight[request.application_id]
            # Its claim finished and its connection did not ask again (yet).
            self._leave_if_idle(request.application_id)
        overtaken = request.connection_id in self._overtaken
        self._overtaken.discard(request.connection_id)
        if request.connection_id in self._departed:
            self._departed.discard(request.connection_id)
            self._paces.pop(request.connection_id, None)
        if empty and not overtaken:
            self.cache.store_empty(cache_key(request, grant.queue_id), now)

    def forget_connection(self, connection_id: str) -> None:
        """The connection is gone for good: drop its request and its pacing record (at once,
        or when its in-flight claim completes)."""
        self.withdraw(connection_id)
        if connection_id in self._in_flight:
            self._departed.add(connection_id)
        else:
            self._paces.pop(connection_id, None)

    def task_arrived(self, queue_id: str) -> None:
        """A task was accepted for ``queue_id`` through this node: its empty entries are stale,
        and so is an empty result of a claim of that queue that is running now (its read may
        have started before the task's commit). Arrivals win over probes."""
        self.cache.forget_queue(queue_id)
        for connection_id, grant in self._in_flight.items():
            if grant.queue_id == queue_id:
                self._overtaken.add(connection_id)

    def next_wakeup(self, now: float) -> float | None:
        """When a waiting request may become eligible without any event, if ever.

        Only time can make a request eligible when its connection is paced out (the next
        cycle) or every queue of it has a fresh empty entry (the earliest expiry). A request
        whose application is at its in-flight limit waits for that claim to complete, which
        is an event, not a time; the same holds when every SQL slot is busy. Never returns a
        time at or before ``now``: a loop that sleeps until then would not sleep at all."""
        if not self._pending or len(self._in_flight) >= self.limits.sql_slots:
            return None
        earliest: float | None = None
        for request in self._pending.values():
            if self._app_in_flight[request.application_id] >= self.limits.in_flight_per_application:
                continue
            if self._paced_out(request.connection_id, now):
                when = self.pacing.ready_at(self._paces.get(request.connection_id), now)
            else:
                expiries = [self.cache.expires_at(cache_key(request, q), now) for q in request.queue_ids]
                if any(e is None for e in expiries):
                    continue  # eligible now: ``grant`` takes it when a slot frees (an event)
                when = min(e for e in expiries if e is not None)
            if when > now and (earliest is None or when < earliest):
                earliest = when
        return earliest

    def statistics(self) -> SchedulerStatistics:
        times = self._apps.times()
        return SchedulerStatistics(
            pending=len(self._pending),
            in_flight=len(self._in_flight),
            active_applications=len(self._apps),
            turns_by_application=dict(self._turns),
            max_in_flight_seen=self._max_in_flight,
            max_application_in_flight_seen=self._max_app_in_flight,
            max_requests_seen=self._max_requests,
            cached_empty_skips=self._cached_skips,
            refused=self._refused,
            tracked_connections=len(self._paces),
            virtual_time=self._apps.now / TURN,
            virtual_time_by_application={app_id: time / TURN for app_id, time in sorted(times.items())},
            weight_by_application={
                app_id: self.weight(app_id) for app_id in sorted(times.keys() | self._weights.keys())
            },
        )
