"""Fairness weights from the database to the node's claim scheduler.

An operator sets an application's weight in the database (``orbit-admin application
weight``, column ``applications.fairness_weight``). Every node reads the weights other
than 1 about once a second and hands each change to its ``FairScheduler``
(``set_weight``), when it serves Workers, and to its request admission (``admission/fair.py``); an application whose weight went back to 1 (or that is gone) is set
back to 1. So a changed weight applies on every node within about a second, from the
application's next turn there. Until the first read, and while the database cannot be
read, the scheduler keeps the weights it has.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import attrs

from .periodic import PeriodicService

log = logging.getLogger("orbit.claims")

# How often a node reads the applications' fairness weights.
WEIGHTS_REFRESH_S = 1.0


def _everything(application_id: str) -> bool:
    return True


@attrs.frozen
class WeightChanges:
    """What a refresh changed: applications given a weight other than 1, and set back to 1."""

    weighted: int = 0
    reset: int = 0
    # Always False: one read covers every weight (``PeriodicService`` asks).
    saturated: bool = False

    def __add__(self, other: WeightChanges) -> WeightChanges:
        return WeightChanges(self.weighted + other.weighted, self.reset + other.reset)


@attrs.define(eq=False)
class WeightFollower(PeriodicService):
    """Keeps the scheduler's weights equal to one shard's ``applications.fairness_weight``."""

    # Application id -> weight, of the applications whose weight is not 1
    # (``TenancyStore.application_weights``).
    read: Callable[[], Awaitable[Mapping[str, int]]]
    # ``FairScheduler.set_weight`` and ``FairAdmission.set_weight`` (services.py).
    apply: Callable[[str, int], None]
    # Whether an application's weight is this shard's to give (``Shards.holds``): with
    # ORBIT_SHARDS, a row left behind on another shard does not count.
    holds: Callable[[str], bool] = _everything
    interval_s: float = WEIGHTS_REFRESH_S
    totals: WeightChanges = attrs.field(factory=WeightChanges)
    # The weights other than 1 this follower gave the scheduler.
    _applied: dict[str, int] = attrs.field(factory=dict, init=False)

    log = log
    failure = "could not read the fairness weights (the weights already applied stay)"

    async def one_pass(self) -> WeightChanges:
        """Read the weights and apply what changed."""
        weights = {app: weight for app, weight in (await self.read()).items() if self.holds(app)}
        reset = sorted(self._applied.keys() - weights.keys())
        weighted = sorted(app for app, weight in weights.items() if self._applied.get(app) != weight)
        for app in reset:
            self.apply(app, 1)
        for app in weighted:
            self.apply(app, weights[app])
        self._applied = weights
        return WeightChanges(len(weighted), len(reset))

    def empty_stats(self) -> WeightChanges:
        return WeightChanges()

    def report(self, changes: WeightChanges) -> None:
        log.info("fairness weights changed: %d set, %d back to 1", changes.weighted, changes.reset)
