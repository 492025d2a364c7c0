"""Submit rate limits per application (``applications.submits_per_second`` / ``submit_burst``).

An operator sets an application's rate and burst in the database (``orbit-admin
application rate``). Every node enforces its share of them on ``POST /v1/tasks`` and
``POST /v1/tasks/batch`` with one token bucket per limited application: a rate of
``rate / N`` tasks per second and a depth of ``burst / N`` (at least one task), where N is
the number of live nodes (``nodes`` rows with a heartbeat younger than ``NODE_STALE_S``).
``RateFollower`` reads the limits and N once a second (one statement per shard) and
reshapes the buckets; nothing is written per submit. So the cluster admits the limit
exactly when the balancer spreads requests evenly, and at most N times a node's share
(the whole limit) however it spreads them, less when it sends everything to one node
(that node admits its share only): docs/operations.md, "Submit rate per application".

The bucket and the shares are pure and synchronous on an injected clock (trio's in the
node); the follower is the thin I/O around them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from ..dispatch.periodic import PeriodicService
from ..domain.submit_limit import SubmitLimit

log = logging.getLogger("orbit.submit_rate")

# How often a node reads the applications' submit limits and the number of live nodes: a
# changed limit, and a node that joins, apply within about this long.
RATES_REFRESH_S = 1.0
# Retry-After of a refusal by a bucket that never refills (a rate of 0): the limit is read
# again within a second, so that is when another try may succeed.
CLOSED_RETRY_AFTER_S = 1


@attrs.define(eq=False)
class TokenBucket:
    """``depth`` tokens at most, refilled at ``rate`` per second of the injected clock;
    a submitted task takes one. Whole tasks only: a fraction of a token admits nothing."""

    rate: float
    depth: float
    tokens: float
    # The clock reading ``tokens`` was counted at.
    at: float

    @classmethod
    def full(cls, rate: float, depth: float, now: float) -> TokenBucket:
        return cls(rate, depth, depth, now)

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.depth, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def available(self, now: float) -> float:
        self._refill(now)
        return self.tokens

    def take(self, wanted: int, now: float) -> int:
        """Take up to ``wanted`` tokens, as many whole ones as there are; returns how many."""
        self._refill(now)
        taken = max(0, min(wanted, math.floor(self.tokens + 1e-9)))
        self.tokens = max(0.0, self.tokens - taken)
        return taken

    def give_back(self, count: int, now: float) -> None:
        """Return tokens taken for tasks that were not created (never above the depth)."""
        self._refill(now)
        self.tokens = min(self.depth, self.tokens + count)

    def wait_s(self, now: float) -> float:
        """Seconds until one whole token is there (0 now; inf when it never will be)."""
        self._refill(now)
        missing = 1.0 - self.tokens
        if missing <= 1e-9:
            return 0.0
        if self.rate <= 0 or self.depth < 1:
            return math.inf
        return missing / self.rate

    def retry_after_s(self, now: float) -> int:
        """``wait_s`` as a Retry-After header says it: whole seconds, rounded up, at least 1."""
        wait = self.wait_s(now)
        if math.isinf(wait):
            return CLOSED_RETRY_AFTER_S
        return max(1, math.ceil(wait - 1e-9))

    def reshape(self, rate: float, depth: float, now: float) -> None:
        """New rate and depth from ``now``: what refilled until now at the old rate stays,
        up to the new depth."""
        self._refill(now)
        self.rate, self.depth = rate, depth
        self.tokens = min(self.tokens, depth)


@attrs.frozen
class Admission:
    """What a node's share let through of a request's tasks."""

    # Tasks admitted (the first ones, in request order).
    admitted: int
    # Whole seconds until another task would be admitted; 0 when every task was.
    retry_after_s: int = 0


@attrs.define(eq=False)
class SubmitRates:
    """One shard's applications' limits and this node's buckets for them."""

    clock: Callable[[], float] = trio.current_time
    # Application id -> its limit, of the applications that have one.
    limits: dict[str, SubmitLimit] = attrs.field(factory=dict)
    # Live nodes the limits are shared among (1 until the first read).
    nodes: int = 1
    _buckets: dict[str, TokenBucket] = attrs.field(factory=dict, init=False)

    def configure(self, limits: Mapping[str, SubmitLimit], nodes: int) -> int:
        """Apply a reading of the limits and the live nodes; returns how many buckets changed.

        A new limit starts with a full bucket; a changed one keeps the tokens it has (up to
        its new depth); an application without a limit any more loses its bucket."""
        now = self.clock()
        nodes = max(1, nodes)
        changed = 0
        for app in self._buckets.keys() - limits.keys():
            del self._buckets[app]
            changed += 1
        for app, limit in limits.items():
            rate, depth = limit.share(nodes)
            bucket = self._buckets.get(app)
            if bucket is None:
                self._buckets[app] = TokenBucket.full(rate, depth, now)
                changed += 1
            elif (bucket.rate, bucket.depth) != (rate, depth):
                bucket.reshape(rate, depth, now)
                changed += 1
        self.limits, self.nodes = dict(limits), nodes
        return changed

    def admit(self, application_id: str, wanted: int) -> Admission:
        """Take tokens for ``wanted`` tasks of the application; an unlimited one has all."""
        bucket = self._buckets.get(application_id)
        if bucket is None or wanted <= 0:
            return Admission(wanted)
        now = self.clock()
        admitted = bucket.take(wanted, now)
        if admitted == wanted:
            return Admission(admitted)
        return Admission(admitted, bucket.retry_after_s(now))

    def give_back(self, application_id: str, count: int) -> None:
        """Tokens taken for tasks that were not created (a repeat, a refusal) go back."""
        bucket = self._buckets.get(application_id)
        if bucket is not None and count > 0:
            bucket.give_back(count, self.clock())

    def bucket(self, application_id: str) -> TokenBucket | None:
        return self._buckets.get(application_id)


@attrs.frozen
class RateChanges:
    """What a refresh changed: buckets made, reshaped or dropped."""

    changed: int = 0
    # Always False: one read covers every limit (``PeriodicService`` asks).
    saturated: bool = False

    def __add__(self, other: RateChanges) -> RateChanges:
        return RateChanges(self.changed + other.changed)


@attrs.define(eq=False)
class RateFollower(PeriodicService):
    """Keeps a shard's ``SubmitRates`` equal to its ``applications`` limits and live nodes."""

    # (application id -> limit of those that have one, live nodes):
    # ``TenancyStore.submit_limits``.
    read: Callable[[], Awaitable[tuple[Mapping[str, SubmitLimit], int]]]
    rates: SubmitRates
    interval_s: float = RATES_REFRESH_S
    totals: RateChanges = attrs.field(factory=RateChanges)

    log = log
    failure = "could not read the submit rate limits (the limits already applied stay)"

    async def one_pass(self) -> RateChanges:
        limits, nodes = await self.read()
        return RateChanges(self.rates.configure(limits, nodes))

    def empty_stats(self) -> RateChanges:
        return RateChanges()

    def report(self, changes: RateChanges) -> None:
        log.info(
            "submit rate limits changed: %d buckets (%d limited applications, %d live nodes)",
            changes.changed,
            len(self.rates.limits),
            self.rates.nodes,
        )
