"""Fair admission of HTTP requests between applications.

After authentication (cheap: the credential cache), a request's expensive part, its
route handler (reading and validating the body, running its transaction), waits for its
turn on the node: at most ``slots`` handlers run at once node-wide and at most
``per_application`` of one application while another application waits (alone, an
application may hold ``solo`` slots: all but ``reserve``, kept for a newcomer, so the
admission costs a lone application's group commits nothing); the next waiting request is
chosen by virtual time with the applications' fairness weights (``Rotation``, the claim
scheduler's). When
the node is saturated (``max_waiting`` requests already wait), a request of an
application over its weighted share of the waiting bound plus the slots is refused at
once (429 ``RESOURCE_EXHAUSTED``, field ``requests``); one under its share always waits
its turn. docs/operations.md, "Fair admission of requests".

``FairAdmission`` decides (pure, synchronous, no clock); ``AdmissionGate`` is the thin trio
adapter that awaits a turn.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from itertools import count

import attrs
import trio

from ..config import AdmissionLimits
from ..dispatch.rotation import TURN, Rotation, check_weight
from ..domain.errors import ResourceExhausted

# Retry-After of a refused request: the waiting requests of a saturated node are served
# within about a second, so that is when another try may pass.
REFUSED_RETRY_AFTER_S = 1


class Verdict(enum.Enum):
    GRANTED = "granted"
    WAIT = "wait"
    REFUSED = "refused"


@attrs.frozen
class AdmissionStatistics:
    busy: int
    waiting: int
    # Application id -> handlers in progress, of those that have any.
    running: dict[str, int]
    # Application id -> requests waiting, of those that have any.
    queued: dict[str, int]


@attrs.define(eq=False)
class FairAdmission:
    """Who of the requests that arrive runs its handler now, waits, or is refused."""

    limits: AdmissionLimits = attrs.field(factory=AdmissionLimits)
    busy: int = attrs.field(default=0, init=False)
    waiting: int = attrs.field(default=0, init=False)
    # Application id -> handlers in progress (no entry: none).
    _running: dict[str, int] = attrs.field(factory=dict, init=False)
    # Application id -> its waiting tickets, first come first.
    _queues: dict[str, deque[int]] = attrs.field(factory=dict, init=False)
    # Waiting ticket -> its application.
    _owner: dict[int, str] = attrs.field(factory=dict, init=False)
    # Applications with requests waiting, in virtual time.
    _rotation: Rotation = attrs.field(factory=Rotation, init=False)
    _weights: dict[str, int] = attrs.field(factory=dict, init=False)
    _tickets: count[int] = attrs.field(factory=count, init=False)

    def set_weight(self, application_id: str, weight: int) -> None:
        """The application's fairness weight (1 to 100; 1 is the default)."""
        if check_weight(weight) == 1:
            self._weights.pop(application_id, None)
        else:
            self._weights[application_id] = weight

    def weight(self, application_id: str) -> int:
        return self._weights.get(application_id, 1)

    @property
    def solo(self) -> int:
        """Handlers an application may hold while no request of any application waits."""
        limits = self.limits
        return max(limits.per_application, limits.slots - limits.reserve)

    def arrive(self, application_id: str, *, returning: bool = False) -> tuple[Verdict, int]:
        """A request of the application wants its turn: granted at once (it runs now and
        must be ``release``d), waiting (its ticket is granted by a later ``release``, or
        ``cancel`` it), or refused. A ``returning`` request (one that gave its turn back
        while it waited for something else) is never refused: it waits its turn."""
        running = self._running.get(application_id, 0)
        limits = self.limits
        # Fast path. After every decision either every slot is busy or every application
        # that waits holds its per_application (and there is no room beyond it): a free slot
        # and room of its own mean that nobody who could run is waiting, so taking it jumps
        # no line. Beyond its per_application, only while nobody waits at all.
        if (self.busy < limits.slots and running < limits.per_application) or (
            not self.waiting and running < self.solo and self.busy < limits.slots - limits.reserve
        ):
            self._running[application_id] = running + 1
            self.busy += 1
            return Verdict.GRANTED, -1
        queue = self._queues.get(application_id)
        if self.waiting >= limits.max_waiting and not returning:
            held = running + (0 if queue is None else len(queue))
            if held + 1 > self.share(application_id):
                return Verdict.REFUSED, -1
        ticket = next(self._tickets)
        if queue is None:
            queue = self._queues[application_id] = deque()
            self._rotation.join(application_id)
        queue.append(ticket)
        self._owner[ticket] = application_id
        self.waiting += 1
        return Verdict.WAIT, ticket

    def share(self, application_id: str) -> float:
        """The application's weighted share of the waiting bound plus the slots, among the
        applications with requests waiting or in progress (itself included)."""
        present = self._running.keys() | self._queues.keys() | {application_id}
        total = sum(self.weight(app) for app in present)
        bound = self.limits.max_waiting + self.limits.slots
        return bound * self.weight(application_id) / total

    def release(self, application_id: str) -> list[int]:
        """A granted request of the application finished; returns the tickets granted now."""
        running = self._running[application_id] - 1
        if running:
            self._running[application_id] = running
        else:
            del self._running[application_id]
        self.busy -= 1
        if not self.waiting:
            return []
        return self._grant()

    def cancel(self, ticket: int) -> bool:
        """A waiting request left the queue (its client went away); False when it was
        not waiting (granted already, or unknown)."""
        application_id = self._owner.pop(ticket, None)
        if application_id is None:
            return False
        queue = self._queues[application_id]
        queue.remove(ticket)
        self.waiting -= 1
        if not queue:
            del self._queues[application_id]
            self._rotation.leave(application_id)
        return True

    def _grant(self) -> list[int]:
        granted: list[int] = []
        limits = self.limits
        while self.busy < limits.slots and self.waiting:
            held: list[str] = []
            chosen = None
            for app in self._rotation.order():
                if self._running.get(app, 0) < limits.per_application:
                    chosen = app
                    break
                held.append(app)
            if chosen is None:
                # Every waiting application holds its per_application: the first in
                # virtual time may go beyond it while the reserve stays free.
                if self.busy >= limits.slots - limits.reserve:
                    break
                room = [app for app in held if self._running.get(app, 0) < self.solo]
                if not room:
                    break
                chosen = room[0]
                held = held[: held.index(chosen)]
            queue = self._queues[chosen]
            ticket = queue.popleft()
            del self._owner[ticket]
            self.waiting -= 1
            self._running[chosen] = self._running.get(chosen, 0) + 1
            self.busy += 1
            # Applications held back by their own per_application keep their place.
            self._rotation.served(chosen, TURN // self.weight(chosen), held=held)
            if not queue:
                del self._queues[chosen]
                self._rotation.leave(chosen)
            granted.append(ticket)
        return granted

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(
            busy=self.busy,
            waiting=self.waiting,
            running=dict(self._running),
            queued={app: len(queue) for app, queue in self._queues.items()},
        )


class RequestsRefused(ResourceExhausted):
    """The node is saturated and the application is over its share of it."""

    def __init__(self) -> None:
        super().__init__(
            "requests: this node is saturated and the application has more than its share of its "
            "requests in progress or waiting; retry later",
            field="requests",
            retry_after_s=REFUSED_RETRY_AFTER_S,
        )


def _ignore_wait(application_id: str, seconds: float) -> None:
    return None


@attrs.define(eq=False)
class Turn:
    """A request's turn (``AdmissionGate.turn``), which it may give back for a while."""

    gate: AdmissionGate
    application_id: str
    name: str
    held: bool = True

    @asynccontextmanager
    async def away(self) -> AsyncIterator[None]:
        """Give the turn back for the block (the request waits for something that is not
        the node's work: a task to finish), then wait for one again as a request arriving
        now would, never refused (``FairAdmission.arrive``'s ``returning``)."""
        self.gate._release(self.application_id)
        self.held = False
        try:
            yield
        finally:
            # Cancelled (the client went away): no turn is taken again, none is released.
            await self.gate._take(self.application_id, self.name, returning=True)
            self.held = True


@attrs.define(eq=False)
class AdmissionGate:
    """The trio side: a request awaits its turn (``async with gate.turn(app)``)."""

    fair: FairAdmission
    # (application name, seconds waited): every admitted request, 0 for one that did not wait.
    observe_wait: Callable[[str, float], None] = _ignore_wait
    # (application name): a refused request.
    observe_refused: Callable[[str], None] = lambda application: None
    _events: dict[int, trio.Event] = attrs.field(factory=dict, init=False)

    @asynccontextmanager
    async def turn(self, application_id: str, name: str) -> AsyncIterator[Turn]:
        """Hold one of the application's turns for the block; RequestsRefused at once
        when the node is saturated and the application is over its share. ``name`` labels
        the metrics."""
        await self._take(application_id, name)
        turn = Turn(self, application_id, name)
        try:
            yield turn
        finally:
            if turn.held:
                self._release(application_id)

    async def _take(self, application_id: str, name: str, *, returning: bool = False) -> None:
        verdict, ticket = self.fair.arrive(application_id, returning=returning)
        if verdict is Verdict.GRANTED:
            self.observe_wait(name, 0.0)
        elif verdict is Verdict.REFUSED:
            self.observe_refused(name)
            raise RequestsRefused()
        else:
            start = trio.current_time()
            await self._wait(application_id, ticket)
            self.observe_wait(name, trio.current_time() - start)

    def _release(self, application_id: str) -> None:
        self._wake(self.fair.release(application_id))

    async def _wait(self, application_id: str, ticket: int) -> None:
        event = self._events[ticket] = trio.Event()
        try:
            await event.wait()
        except BaseException:
            self._events.pop(ticket, None)
            if not self.fair.cancel(ticket):
                # Granted while being cancelled: the turn goes to the next one.
                self._wake(self.fair.release(application_id))
            raise

    def _wake(self, tickets: list[int]) -> None:
        for ticket in tickets:
            self._events.pop(ticket).set()
