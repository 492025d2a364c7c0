"""Start-time fair queueing over named members, in exact virtual time: the rotation the
fair claim scheduler (``scheduler.py``) runs between applications and, inside each,
between its queues. Pure: no I/O, no clock."""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterator
from itertools import count

import attrs

from ..domain.rules import MAX_WEIGHT, MIN_WEIGHT

# Virtual time is counted in units of 1/TURN of a turn at weight 1. Every weight from 1
# to MAX_WEIGHT divides TURN, so a turn at any weight costs a whole number of units:
# virtual times are exact integers and ties between them are exact.
TURN = math.lcm(*range(MIN_WEIGHT, MAX_WEIGHT + 1))


def check_weight(weight: int) -> int:
    """``weight`` if it is a valid fairness weight (an integer from 1 to 100), else ValueError."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(f"a fairness weight is an integer from {MIN_WEIGHT} to {MAX_WEIGHT}, got {weight!r}")
    return weight


@attrs.define(eq=False)
class Rotation:
    """Start-time fair queueing over named members, in virtual time (units of ``TURN``).

    A member's turn costs it ``cost`` units (``TURN // weight``). ``now`` is the virtual
    time at which the latest turn started; it never goes back. ``order()`` lists the
    members by start time, ``max(own time, now)``, and then by how long each has waited
    (the order of its last turn or arrival): a member that fell behind while it could not
    be served starts level with ``now`` (one turn, no catching up), one ahead keeps its
    lead. A member that leaves is remembered while its time is ahead of ``now``, so that it
    keeps its place if it comes back before the others catch up with it; once ``now``
    reaches its time it is forgotten (it would start at ``now`` anyway), so only members
    and leavers of about the last round are held.
    """

    now: int = 0
    # Own virtual time of every member and remembered leaver; a member's is never below
    # ``now`` (raised to it when ``now`` passes it: the same start, kept sorted).
    _time: dict[str, int] = attrs.field(factory=dict, init=False)
    # Tie-break, per member and remembered leaver: smaller = has waited longer.
    _since: dict[str, int] = attrs.field(factory=dict, init=False)
    # The members as (time, since, key), sorted: whose turn first.
    _line: list[tuple[int, int, str]] = attrs.field(factory=list, init=False)
    _members: set[str] = attrs.field(factory=set, init=False)
    # Remembered leavers (time ahead of ``now`` when they left).
    _gone: set[str] = attrs.field(factory=set, init=False)
    _ticket: count[int] = attrs.field(factory=count, init=False)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def times(self) -> dict[str, int]:
        """Per member and remembered leaver: the virtual time its next turn would start at."""
        return {key: max(own, self.now) for key, own in self._time.items()}

    def join(self, key: str) -> None:
        """``key`` has something waiting. A remembered leaver resumes its time and place;
        anyone else starts at ``now``, behind those already waiting there."""
        if key in self._members:
            return
        self._members.add(key)
        self._gone.discard(key)
        own = self._time.get(key)
        if own is None or own <= self.now:
            self._time[key] = self.now
            self._since[key] = next(self._ticket)
        bisect.insort(self._line, self._entry(key))

    def leave(self, key: str) -> bool:
        """``key`` has nothing waiting and nothing running; True when it is forgotten now."""
        if key not in self._members:
            return False
        self._members.discard(key)
        self._unline(key)
        if self._time[key] <= self.now:
            self._forget(key)
            return True
        self._gone.add(key)
        return False

    def order(self) -> Iterator[str]:
        """The members, whose turn first (do not change the rotation while iterating)."""
        return (key for _, _, key in self._line)

    def served(self, key: str, cost: int, *, held: Collection[str] = ()) -> list[str]:
        """``key`` (a member) takes a turn of ``cost`` units. Returns the leavers this
        forgets (``now`` has caught up with them).

        Members behind the turn's start start level with it from now on, but for those in
        ``held``: members that wanted a turn and were held back by a rule of their own (in
        the scheduler, their claim in flight or their connections' pace). Those keep their
        time, and their place ahead of the others, until they are served."""
        self._unline(key)
        start = self._time[key]
        self._time[key] = start + cost
        self._since[key] = next(self._ticket)
        bisect.insort(self._line, self._entry(key))
        if start == self.now:
            return []
        self.now = start
        return self._catch_up(held)

    def charge(self, key: str, cost: int, *, lead_at_most: int | None = None) -> None:
        """Move a known ``key`` ``cost`` units later, as if it had taken turns worth that.
        With ``lead_at_most``, its time ends at most that far ahead of ``now``: whatever
        lead it had beyond that is dropped."""
        own = self._time.get(key)
        if own is None:
            return
        time = max(own, self.now) + cost
        if lead_at_most is not None:
            time = min(time, self.now + lead_at_most)
        if key in self._members:
            self._unline(key)
            self._time[key] = time
            bisect.insort(self._line, self._entry(key))
        else:
            self._time[key] = time
            self._gone.add(key)

    def _entry(self, key: str) -> tuple[int, int, str]:
        return (self._time[key], self._since[key], key)

    def _unline(self, key: str) -> None:
        del self._line[bisect.bisect_left(self._line, self._entry(key))]

    def _catch_up(self, held: Collection[str]) -> list[str]:
        """``now`` moved on: members behind it start level with it (ordered by how long
        they have waited), but for the ``held`` ones, which keep their time up to one
        turn (at weight 1) behind ``now``; leavers it reached are forgotten (returned).

        The bound: a member held again and again (an application at its per_application
        while others' requests come and go) would otherwise bank a turn each time others
        are served, and spend them all, ahead of a newcomer, when its hold ends."""
        if self._line[0][0] < self.now:
            level = bisect.bisect_left(self._line, (self.now + 1,))
            entries = []
            for time, since, key in self._line[:level]:
                if key not in held:
                    time = self._time[key] = self.now
                elif time < self.now - TURN:
                    time = self._time[key] = self.now - TURN
                entries.append((time, since, key))
            self._line[:level] = sorted(entries)
        forgotten = [key for key in self._gone if self._time[key] <= self.now]
        for key in forgotten:
            self._forget(key)
        return forgotten

    def _forget(self, key: str) -> None:
        self._gone.discard(key)
        del self._time[key]
        del self._since[key]
