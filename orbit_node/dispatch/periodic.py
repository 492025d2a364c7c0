"""The engine of the node's periodic database services (recovery sweeper, plan trigger,
fairness weight follower).

A *round* runs passes back to back while a pass reports more work waiting
(``saturated``), at most ``MAX_BACK_TO_BACK_PASSES`` times, then the service sleeps
for its interval: a backlog is worked off quickly without monopolising a database
connection. A failing round (database unreachable) is logged and retried at the
next interval. The trio clock only paces rounds; what is due is always decided by
the database clock inside each pass.
"""

from __future__ import annotations

import abc
import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..domain.errors import OrbitError

# Passes run back to back while they find more work, at most this many per round.
MAX_BACK_TO_BACK_PASSES = 16


@attrs.define(eq=False)
class PeriodicService(abc.ABC):
    """Subclasses provide ``interval_s``, ``one_pass()``, ``empty_stats()`` and ``report()``.

    Pass statistics are attrs classes with a ``saturated`` flag that add with ``+``.
    """

    passes: int = attrs.field(default=0, init=False)
    _pass_done: trio.Event = attrs.field(factory=trio.Event, init=False)

    if TYPE_CHECKING:
        # Fields of every subclass (its own attrs fields, in its own order): seconds between
        # rounds, and the sum of every round's statistics.
        interval_s: float
        totals: Any

    log = logging.getLogger("orbit.periodic")
    failure = "periodic pass failed"

    @abc.abstractmethod
    async def one_pass(self) -> Any:
        """One pass over the database; returns its statistics."""

    @abc.abstractmethod
    def empty_stats(self) -> Any:
        """Statistics of a pass that did nothing."""

    def report(self, stats: Any) -> None:  # noqa: B027 - an optional hook, a no-op unless overridden
        """Log what a round did (called only for rounds that did something)."""

    async def run_round(self) -> Any:
        """Passes until one is not saturated (bounded); returns what they did together."""
        total = self.empty_stats()
        for _ in range(MAX_BACK_TO_BACK_PASSES):
            stats = await self.one_pass()
            total = total + stats
            if not stats.saturated:
                break
        total = attrs.evolve(total, saturated=False)
        self.totals = self.totals + total
        return total

    async def wait_for_pass(self) -> None:
        """Wait until the round that runs next has finished (tests and operators)."""
        await self._pass_done.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        while True:
            try:
                stats = await self.run_round()
            except OrbitError as exc:
                # The database may be unreachable for a while; the next round tries again.
                self.log.warning("%s: %s", self.failure, exc.message)
            else:
                if stats != self.empty_stats():
                    self.report(stats)
            self.passes += 1
            done, self._pass_done = self._pass_done, trio.Event()
            done.set()
            await trio.sleep(self.interval_s)
