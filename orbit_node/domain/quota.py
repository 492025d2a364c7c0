"""Application and queue quotas: concurrency caps and fixed-window start rates.

Pure rules over the values a claim read from its locked quota rows; the claim
transaction (``orbit_node.store.claim``) reads and writes the rows.
"""

from __future__ import annotations

import calendar
from datetime import datetime

import attrs


def epoch_second(moment: datetime) -> int:
    """The database-clock second of a naive UTC datetime (same as UNIX_TIMESTAMP())."""
    return calendar.timegm(moment.utctimetuple())


@attrs.frozen
class Budget:
    """How many more reservations one quota row allows in this claim."""

    remaining: int
    # The start-rate window this claim counts in (None: no start-rate control).
    window_s: int | None = None
    window_used: int = 0


# No cap: more than any claim batch can take.
UNLIMITED = Budget(remaining=1 << 30)


def quota_budget(
    *,
    max_concurrent: int | None,
    live: int,
    max_per_second: int | None,
    window_s: int,
    window_count: int,
    now_s: int,
) -> Budget:
    """Concurrency cap and fixed-window start rate of one application or queue row.

    A stored window at or after ``now_s`` is the current one (a claim that waited for
    the row lock may have read the clock before the holder wrote a later second), so the
    rule never grants more than ``max_per_second`` reservations per window second.
    """
    remaining = UNLIMITED.remaining
    if max_concurrent is not None:
        remaining = max(0, max_concurrent - live)
    if max_per_second is None:
        return Budget(remaining)
    if window_s >= now_s:
        window, used = window_s, window_count
    else:
        window, used = now_s, 0
    return Budget(min(remaining, max(0, max_per_second - used)), window, used)


def window_after(budget: Budget, reserved: int, reserved_s: int) -> tuple[int, int]:
    """The (window second, count) to store after ``reserved`` reservations at ``reserved_s``."""
    assert budget.window_s is not None
    if reserved_s <= budget.window_s:
        return budget.window_s, budget.window_used + reserved
    return reserved_s, reserved
