"""Requests waiting for a task to finish (``GET /v1/tasks/{id}?wait_s=N``, docs/api.md).

``TaskWaits`` is one shard's: a request whose task is not finished waits here for a
wake-up, holding no database session, and reads its task again once woken (or once its
time is up). What wakes it, without a query per waiting request:

* a finish through this node (a Worker's Finish or Start, a cancel): at once;
* a finish through another node: that node writes a ``finished`` signal for a task a
  node's requests wait for (each waiting node writes a ``watch`` of it first), which this
  node's signal reader hears (``dispatch/signals.py``);
* anything else (a lost signal, a node of an older version, ``orbit-admin``, a lease
  recovered into a final state): this node reads the states of every task its requests
  wait for, in one statement, every ``check_interval_s`` while any waits.

Shutdown wakes every waiting request at once: each answers with its task as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import attrs
import trio

from ..domain.errors import OrbitError
from ..domain.task_query import TERMINAL_STATES
from ..store.tasks import TaskStore
from .signals import SignalRelay

log = logging.getLogger("orbit.waits")

# How often a node reads the states of the tasks its requests wait for (one statement for
# all of them): the bound on the latency of a finish no signal told it of.
CHECK_INTERVAL_S = 1.0
# Tasks named by one such statement at most.
CHECK_BATCH = 1000


@attrs.define(eq=False)
class _Waiting:
    """The requests waiting for one task: a count, and the event that wakes them all."""

    count: int = 0
    event: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class TaskWaits:
    tasks: TaskStore
    # Set when the node begins to shut down: every waiting request answers at once.
    stopping: trio.Event = attrs.field(factory=trio.Event)
    # The shard's signals between nodes (None: a node without them hears no other node).
    signals: SignalRelay | None = None
    check_interval_s: float = CHECK_INTERVAL_S
    _waiting: dict[str, _Waiting] = attrs.field(factory=dict, init=False)
    # Set when the first request begins to wait (the check loop sleeps while none does).
    _begun: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Requests that waited, and how their waits ended.
    woken: int = attrs.field(default=0, init=False)
    timed_out: int = attrs.field(default=0, init=False)
    checks: int = attrs.field(default=0, init=False)

    @property
    def waiting_requests(self) -> int:
        return sum(w.count for w in self._waiting.values())

    def any_waiting(self) -> bool:
        return bool(self._waiting)

    async def wait(self, task_id: str, deadline: float) -> bool:
        """Wait until ``task_id`` may have finished (True: read it again) or until
        ``deadline`` on trio's clock, or the node's shutdown (False)."""
        if self.stopping.is_set():
            return False
        waiting = self._waiting.get(task_id)
        if waiting is None:
            waiting = self._waiting[task_id] = _Waiting()
        waiting.count += 1
        self._begun.set()
        if self.signals is not None:
            self.signals.watch(task_id)
        woken = False
        try:
            with trio.move_on_at(deadline):
                await waiting.event.wait()
                woken = not self.stopping.is_set()
        finally:
            waiting.count -= 1
            if waiting.count == 0 and self._waiting.get(task_id) is waiting:
                del self._waiting[task_id]
        if woken:
            self.woken += 1
        else:
            self.timed_out += 1
        return woken

    def wake(self, task_ids: Iterable[str]) -> None:
        """The requests waiting for these tasks read them again (they may have finished)."""
        for task_id in task_ids:
            waiting = self._waiting.pop(task_id, None)
            if waiting is not None:
                waiting.event.set()

    def finished(self, task_ids: Sequence[str]) -> None:
        """Tasks that finished through this node: its requests waiting for them are woken
        at once, the other nodes' are told through the signals."""
        if not task_ids:
            return
        if self._waiting:
            self.wake(task_ids)
        if self.signals is not None:
            self.signals.tasks_finished(task_ids)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._stop_all)
            nursery.start_soon(self._check)
            task_status.started()

    async def _stop_all(self) -> None:
        await self.stopping.wait()
        for waiting in self._waiting.values():
            waiting.event.set()
        self._waiting.clear()

    async def _check(self) -> None:
        """Every ``check_interval_s`` while requests wait: one read of their tasks' states;
        those that finished (or are gone) wake their requests."""
        failing = False
        while True:
            if not self._waiting:
                self._begun = trio.Event()
                await self._begun.wait()
            await trio.sleep(self.check_interval_s)
            task_ids = list(self._waiting)
            try:
                for start in range(0, len(task_ids), CHECK_BATCH):
                    batch = task_ids[start : start + CHECK_BATCH]
                    states = await self.tasks.states(batch)
                    self.checks += 1
                    self.wake(t for t in batch if t not in states or states[t] in TERMINAL_STATES)
            except OrbitError as exc:
                if not failing:
                    log.warning("could not read the states of the tasks requests wait for: %s", exc)
                failing = True
            else:
                if failing:
                    log.info("the states of the tasks requests wait for are read again")
                failing = False

    def statistics(self) -> dict[str, int]:
        return {
            "waiting": self.waiting_requests,
            "woken": self.woken,
            "timed_out": self.timed_out,
            "checks": self.checks,
        }
