"""Claim turns in the database: each node's cumulative turns per application, and the share across nodes.

Each node rotates its claim turns on its own (``FairScheduler``); an operator wants one
view of every node's rotation (``orbit-admin top``) without reaching every node's
metrics address, so the turns are also written to the table ``claim_turns``.

The same loop reads, once a scan cycle, the other nodes' counters of the applications
this node's rotation knows (one statement), and charges each application the turns it
took elsewhere since the previous read (``share.py``, ``FairScheduler.charge_elsewhere``):
an application served on other nodes waits here for those that were not. The read never
stands between a request and its grant: grants go on from what the rotation holds, and a
read that fails leaves the node rotating on its own until one succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

import attrs
import trio

from ..domain.errors import OrbitError
from ..store.operations import OperationsStore
from .share import TurnsElsewhere

log = logging.getLogger("orbit.claims")

# How often a node writes its claim-turn counters to the database (only changed ones).
TURNS_FLUSH_S = 1.0
# How often a node deletes the counters of nodes that stopped or died long ago.
TURNS_PRUNE_S = 600.0


@attrs.define(eq=False)
class TurnRecorder:
    """Writes a node's cumulative claim turns per application to ``claim_turns``.

    Every ``interval_s`` the applications whose count changed are upserted (absolute
    values, so a lost write is repaired by the next); an idle node writes nothing. On
    stop the node's rows are deleted; rows of nodes that died are pruned by the others.
    """

    store: OperationsStore
    node_id: str
    # The scheduler's cumulative turns per application id.
    turns: Callable[[], Mapping[str, int]]
    # The share across nodes: the applications (of this recorder's database) the node's
    # rotation knows, whose turns on other nodes are read, and where those turns go
    # (``FairScheduler.charge_elsewhere``). Without them the node only records.
    applications: Callable[[], Collection[str]] | None = None
    charge_elsewhere: Callable[[Mapping[str, int]], None] | None = None
    interval_s: float = TURNS_FLUSH_S
    prune_interval_s: float = TURNS_PRUNE_S
    flushes: int = 0
    _elsewhere: TurnsElsewhere = attrs.field(factory=TurnsElsewhere, init=False)
    _recorded: dict[str, int] = attrs.field(factory=dict, init=False)
    # Per application, the cumulative turns already added to claim_turn_minutes.
    _in_minutes: dict[str, int] = attrs.field(factory=dict, init=False)
    _next_prune: float | None = attrs.field(default=None, init=False)
    _flushed: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def flush(self) -> int:
        """Write the changed counters now; returns how many applications were written.

        The turns granted since the last write also go to the current minute's row of
        ``claim_turn_minutes`` (the console's history), each once: they count as added
        only after their statement succeeded."""
        current = dict(self.turns())
        granted = {
            app: n - self._in_minutes.get(app, 0) for app, n in current.items() if n > self._in_minutes.get(app, 0)
        }
        if granted:
            await self.store.add_turn_minutes(self.node_id, granted)
            self._in_minutes.update({app: current[app] for app in granted})
        changed = {app: n for app, n in current.items() if self._recorded.get(app) != n}
        if changed:
            await self.store.record_turns(self.node_id, changed)
            self._recorded.update(changed)
        return len(changed)

    async def read_elsewhere(self) -> dict[str, int]:
        """Read the other live nodes' counters of the applications the rotation knows and
        charge each application what it gained since the previous read; returns that.

        A read that fails (or is cancelled) charges nothing and makes the next read a
        baseline: its gains would span an unknown time."""
        if self.applications is None or self.charge_elsewhere is None:
            return {}
        try:
            counters = await self.store.turns_elsewhere(self.node_id, self.applications())
        except BaseException:
            self._elsewhere.forget()
            raise
        gained = self._elsewhere.update(counters)
        if gained:
            self.charge_elsewhere(gained)
        return gained

    async def wait_for_flush(self) -> None:
        """Wait until the flush that runs next has finished."""
        await self._flushed.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        try:
            while True:
                try:
                    await self.flush()
                    await self.read_elsewhere()
                    now = trio.current_time()
                    if self._next_prune is None or now >= self._next_prune:
                        self._next_prune = now + self.prune_interval_s
                        await self.store.prune_turns()
                        await self.store.prune_turn_minutes()
                except OrbitError as exc:
                    # The database may be unreachable; the counters are written next time, and
                    # until other nodes' counters can be read again this node rotates on its own.
                    self._elsewhere.forget()
                    log.warning("could not record claim turns or read other nodes': %s", exc.message)
                self.flushes += 1
                done, self._flushed = self._flushed, trio.Event()
                done.set()
                await trio.sleep(self.interval_s)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.store.forget_turns(self.node_id)
                except Exception as exc:
                    log.warning("could not delete this node's claim turns (another node prunes them): %s", exc)
