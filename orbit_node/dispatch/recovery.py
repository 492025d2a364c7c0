"""The recovery sweeper: a node service that settles what lost its owner.

Every node runs one; they may all sweep at once (the database transactions skip rows
another sweeper holds). A pass puts expired reservations back in the queue, counts
expired run leases as failed attempts, and expires queued tasks past their deadline.
Decisions use the database clock only; the trio clock here just paces the passes.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ..errors import OrbitError
from ..store.dispatch import DispatchStore, RecoveryStats

log = logging.getLogger("orbit.recovery")

# A pass that filled its batch runs again at once, at most this many times in a row,
# before the sweeper sleeps for one interval (a big backlog is worked off quickly
# without monopolising a database connection).
MAX_BACK_TO_BACK_PASSES = 16


@attrs.define(eq=False)
class Sweeper:
    store: DispatchStore
    interval_s: float
    passes: int = 0
    totals: RecoveryStats = attrs.field(factory=RecoveryStats)
    _pass_done: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def sweep(self) -> RecoveryStats:
        """Run passes until one is not saturated (bounded); returns what they settled."""
        swept = RecoveryStats()
        for _ in range(MAX_BACK_TO_BACK_PASSES):
            stats = await self.store.recover()
            swept = swept + stats
            if not stats.saturated:
                break
        self.totals = self.totals + attrs.evolve(swept, saturated=False)
        return swept

    async def wait_for_pass(self) -> None:
        """Wait until the sweep that runs next has finished (tests and operators)."""
        await self._pass_done.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        while True:
            try:
                swept = await self.sweep()
            except OrbitError as exc:
                # The database may be unreachable for a while; the next pass tries again.
                log.warning("recovery pass failed: %s", exc.message)
            else:
                if swept.total:
                    log.info(
                        "recovered tasks: requeued=%d retried=%d failed=%d cancelled=%d expired=%d",
                        swept.requeued, swept.retried, swept.failed, swept.cancelled, swept.expired,
                    )
            self.passes += 1
            done, self._pass_done = self._pass_done, trio.Event()
            done.set()
            await trio.sleep(self.interval_s)


async def recovery_service(node, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Node service: sweep every ``node.config.sweep_interval_s`` using ``node.db``.

    Reports the ``Sweeper`` through ``task_status``."""
    sweeper = Sweeper(DispatchStore.from_config(node.db, node.config), node.config.sweep_interval_s)
    state = getattr(node, "state", None)  # a bare node (tests) has no shared state
    if state is not None:
        state.services["sweeper"] = sweeper  # read by /metrics (leases recovered) and tests
    await sweeper.run(task_status=task_status)
