"""Retry backoff: exponential, capped, with jitter.

A pure function so the retry rule can be tested without a database. The delay is
added to the database clock (``NOW(6)`` of the finishing transaction), never to a
node's clock.
"""

from __future__ import annotations

import random

# Half of each delay is fixed and half is random ("equal jitter"): retries of many
# tasks that failed together spread out, yet no retry comes sooner than half the
# nominal delay.
JITTER_FRACTION = 0.5


def backoff_delay_ms(
    failed_attempts: int,
    *,
    initial_ms: int,
    max_ms: int,
    multiplier: float,
    rng: random.Random | None = None,
) -> int:
    """Delay before the next attempt after ``failed_attempts`` attempts have failed.

    The nominal delay is ``initial_ms * multiplier ** (failed_attempts - 1)`` capped at
    ``max_ms``; the result lies in ``[nominal * (1 - JITTER_FRACTION), nominal]``.
    """
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be at least 1, got {failed_attempts}")
    initial_ms = max(0, initial_ms)
    max_ms = max(0, max_ms)
    multiplier = max(1.0, multiplier)
    # Cap the exponent's effect before it can overflow a float.
    nominal = float(initial_ms)
    for _ in range(failed_attempts - 1):
        nominal *= multiplier
        if nominal >= max_ms:
            break
    nominal = min(nominal, float(max_ms))
    fixed = nominal * (1.0 - JITTER_FRACTION)
    jitter = (rng or random).uniform(0.0, nominal * JITTER_FRACTION)
    return int(fixed + jitter)
