"""When a plan fires: fixed intervals and/or 5-field cron in a time zone (pure, no I/O).

All instants are naive UTC datetimes with microseconds, like the database's DATETIME(6)
columns in the node's UTC session. "Now" is always passed in: the trigger passes the
database clock's ``NOW(6)``, never the node's clock.

* ``interval_s`` fires at ``anchor + k * interval_s`` for k = 0, 1, 2, ...; the anchor is
  ``start_at`` when given, else the Unix epoch (so "every 3600 s" fires on the hour, UTC,
  whichever node computes it, like Temporal's interval specs).
* ``cron`` fires at the wall-clock minutes the expression matches in ``time_zone``
  (croniter computes them; an instant is a fire time once even when a fall-back
  hour repeats its wall clock: both instants fire; a wall time skipped by a spring-forward
  fires at the first instant after the gap).
* With both, the fire times are the union; a time both produce is one fire time.
* ``start_at``/``end_at`` bound the fire times (both inclusive).

``due_fire_times`` decides what one trigger transaction creates, including the catch-up
policy for fire times that were missed (more than ``grace_s`` late).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import attrs
from croniter import CroniterError, croniter

CATCH_UP_SKIP = "skip"
CATCH_UP_FIRE_ONCE = "fire_once"
CATCH_UP_POLICIES = (CATCH_UP_SKIP, CATCH_UP_FIRE_ONCE)
# Quartz's misfire threshold: a fire time reached within a minute is late, not missed.
DEFAULT_GRACE_S = 60
DEFAULT_TIME_ZONE = "UTC"

EPOCH = datetime(1970, 1, 1)
# The last instant a DATETIME(6) column holds; no fire time lies beyond it.
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999)
ONE_US = timedelta(microseconds=1)
UTC = UTC


def _micros(value: datetime) -> int:
    """Microseconds since the epoch of a naive UTC datetime (exact integer arithmetic)."""
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(value: int) -> datetime | None:
    try:
        result = EPOCH + timedelta(microseconds=value)
    except OverflowError:
        return None
    return result if result <= LATEST else None


@attrs.frozen(kw_only=True)
class Schedule:
    """A validated schedule. At least one of ``interval_s`` and ``cron`` is set."""

    interval_s: int | None = None
    cron: str | None = None
    time_zone: str = DEFAULT_TIME_ZONE
    start_at: datetime | None = None
    end_at: datetime | None = None
    catch_up: str = CATCH_UP_SKIP
    # A fire time the trigger reaches more than this late counts as missed.
    grace_s: int = DEFAULT_GRACE_S
    _zone: ZoneInfo = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.interval_s is None and self.cron is None:
            raise ValueError("a schedule needs interval_s and/or cron")
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ValueError(f"unknown catch-up policy {self.catch_up!r}")
        object.__setattr__(self, "_zone", ZoneInfo(self.time_zone))

    # -- fire times ----------------------------------------------------------------

    def first_at_or_after(self, when: datetime) -> datetime | None:
        """The earliest fire time at or after ``when``; None when there is none (end reached)."""
        lower = max(when, self.start_at) if self.start_at is not None else when
        candidates = []
        if self.interval_s is not None:
            candidates.append(self._interval_at_or_after(lower, self.interval_s))
        if self.cron is not None:
            candidates.append(self._cron_at_or_after(lower))
        found = [c for c in candidates if c is not None]
        if not found:
            return None
        first = min(found)
        if self.end_at is not None and first > self.end_at:
            return None
        return first

    def next_after(self, when: datetime) -> datetime | None:
        """The earliest fire time strictly after ``when``."""
        if when >= LATEST:
            return None
        return self.first_at_or_after(when + ONE_US)

    def last_at_or_before(self, when: datetime) -> datetime | None:
        """The latest fire time at or before ``when``; None when there is none."""
        upper = min(when, self.end_at) if self.end_at is not None else when
        candidates = []
        if self.interval_s is not None:
            candidates.append(self._interval_at_or_before(upper, self.interval_s))
        if self.cron is not None:
            candidates.append(self._cron_at_or_before(upper))
        found = [c for c in candidates if c is not None]
        if not found:
            return None
        last = max(found)
        if self.start_at is not None and last < self.start_at:
            return None
        return last

    def _anchor(self) -> int:
        return _micros(self.start_at) if self.start_at is not None else 0

    def _interval_at_or_after(self, when: datetime, interval_s: int) -> datetime | None:
        step = interval_s * 1_000_000
        anchor = self._anchor()
        offset = max(0, _micros(when) - anchor)
        k = -(-offset // step)  # ceiling division
        return _from_micros(anchor + k * step)

    def _interval_at_or_before(self, when: datetime, interval_s: int) -> datetime | None:
        step = interval_s * 1_000_000
        anchor = self._anchor()
        offset = _micros(when) - anchor
        if offset < 0:
            return None
        return _from_micros(anchor + (offset // step) * step)

    def _cron(self, when: datetime) -> croniter:
        return croniter(self.cron, when.replace(tzinfo=UTC).astimezone(self._zone))

    def _cron_at_or_after(self, when: datetime) -> datetime | None:
        # croniter's get_next is strictly after its start; start one microsecond earlier.
        try:
            found: datetime = self._cron(when - ONE_US).get_next(datetime)
        except (CroniterError, OverflowError, ValueError):
            return None
        return found.astimezone(UTC).replace(tzinfo=None)

    def _cron_at_or_before(self, when: datetime) -> datetime | None:
        if when >= LATEST:
            when = LATEST - ONE_US
        try:
            found: datetime = self._cron(when + ONE_US).get_prev(datetime)
        except (CroniterError, OverflowError, ValueError):
            return None
        result = found.astimezone(UTC).replace(tzinfo=None)
        return result if result >= EPOCH else None


@attrs.frozen
class Firing:
    """What one trigger transaction does for a plan that is due."""

    # The fire times to create a task for, ascending (each at most once).
    fire_times: tuple[datetime, ...]
    # Where the plan continues: the first fire time not handled here (None: no more).
    # It is at or before ``now`` only when ``limit`` cut the batch short.
    next_fire_at: datetime | None
    # Missed fire times (more than grace_s late) were passed over without a task each.
    skipped_missed: bool = False
    # The missed fire time that catch-up "fire_once" created a task for.
    caught_up: datetime | None = None


def due_fire_times(schedule: Schedule, next_fire_at: datetime, now: datetime, *, limit: int) -> Firing:
    """The fire times from ``next_fire_at`` up to ``now`` to create, at most ``limit``.

    ``next_fire_at`` is the plan's stored next fire time (it counts as a fire time even if
    a row was written by hand off the schedule's grid). Fire times at or after
    ``now - grace_s`` are on time and each gets a task. Older ones were missed (no node
    ran, or the database was unreachable): with ``skip`` none of them gets a task; with
    ``fire_once`` exactly one task is created for all of them together, carrying the
    latest missed fire time.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if next_fire_at > now:
        return Firing((), next_fire_at)
    fires: list[datetime] = []
    caught_up = None
    skipped = False
    current: datetime | None = next_fire_at
    cutoff = now - timedelta(seconds=schedule.grace_s)
    if next_fire_at < cutoff:
        # Missed fire times: every one before the cutoff.
        latest_missed = schedule.last_at_or_before(cutoff - ONE_US)
        if latest_missed is None or latest_missed < next_fire_at:
            latest_missed = next_fire_at
        if schedule.catch_up == CATCH_UP_FIRE_ONCE:
            caught_up = latest_missed
            fires.append(latest_missed)
            skipped = latest_missed != next_fire_at
        else:
            skipped = True
        current = schedule.next_after(latest_missed)
    while current is not None and current <= now and len(fires) < limit:
        fires.append(current)
        current = schedule.next_after(current)
    return Firing(tuple(fires), current, skipped_missed=skipped, caught_up=caught_up)
