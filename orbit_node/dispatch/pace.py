"""The claim pace of one Worker connection: P3's "at most 4 claims per scan cycle (1 s)",
spread over the cycle. Pure: the caller gives the time.

The k-th grant of a scan cycle (``floor(now / cycle_s)``) is allowed from ``k - 1``
pace intervals (``cycle_s / per_cycle``: 250 ms) after the cycle's start: the first at
any time, the second from 250 ms into the cycle, the fourth from 750 ms, and none after
the fourth until the next cycle. Never more than ``per_cycle`` grants in a cycle (P3's
limit as written), and a task waits at most one pace interval for its claim (plus a claim
in progress): after any grant, the next one is allowed within 250 ms, or at the next
cycle's start, which is within 250 ms of the cycle's fourth slot.

P3's count alone let the first arrivals of a cycle take its four claims at once, and
everything that arrived after them wait for the next cycle (up to a second: at 20
arrivals a second per connection, p90 517 ms). A quiet connection loses nothing: slots
not used wait for it until the cycle ends, so a task that comes after a lull is claimed
at once.
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class Pace:
    """A connection's pacing record: its grants in scan cycle ``cycle``."""

    cycle: int
    count: int


@attrs.frozen
class Pacing:
    per_cycle: int
    cycle_s: float

    @property
    def interval_s(self) -> float:
        """The pace interval: from one slot of a cycle to the next."""
        return self.cycle_s / self.per_cycle

    def cycle(self, now: float) -> int:
        return math.floor(now / self.cycle_s)

    def _count(self, pace: Pace | None, cycle: int) -> int:
        return pace.count if pace is not None and pace.cycle == cycle else 0

    def ready_at(self, pace: Pace | None, now: float) -> float:
        """The earliest time at or after ``now`` at which a grant is allowed (``now``: at once)."""
        cycle = self.cycle(now)
        count = self._count(pace, cycle)
        if count >= self.per_cycle:
            return (cycle + 1) * self.cycle_s
        return max(now, cycle * self.cycle_s + count * self.interval_s)

    def allows(self, pace: Pace | None, now: float) -> bool:
        return self.ready_at(pace, now) <= now

    def granted(self, pace: Pace | None, now: float) -> Pace:
        """The record after a grant at ``now`` (which ``allows``)."""
        cycle = self.cycle(now)
        return Pace(cycle, self._count(pace, cycle) + 1)
