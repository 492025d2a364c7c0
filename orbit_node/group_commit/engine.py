"""The engine of the node's group commits: many callers' work shares one transaction.

Callers hand an item (a Worker connection's transition batch, one HTTP submit) to a
*lane* and wait for its answer. While a lane's group transaction runs, the items that
arrive for that lane wait; the next transaction takes all of them (group commit, as a
database does with its log). A lone item waits for nothing but the transaction ahead of
it; under load the lane runs one transaction per commit time instead of one per item.
Lanes are the shard key (one application, or one namespace, per transaction): each has
at most one group in flight, and at most ``max_concurrent_groups`` lanes commit at once,
first come first served.

* An item is answered only after the transaction that holds it has committed.
* Items whose ``keys`` meet (the same task named twice) never share a group: the later
  one waits for the next, and nothing overtakes an item left waiting that it meets, so
  each row is decided once per transaction, in arrival order.
* When a group's transaction fails for a reason that one item may have caused (any
  ``OrbitError`` but the database being unreachable), each item runs again alone, so
  only that item fails. Unreachable: every item of the group gets the error.
* A caller cancelled before its item joined a group withdraws it; once taken, the
  group's transaction decides it and only the answer is lost (the caller's retry, under
  the same idempotency key or fencing token, finds what was decided).

Subclasses say how a group runs (``run_group``), how big an item is and which keys it
names; ``submit`` and ``run`` are the engine.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

from ..domain.errors import OrbitError, Unavailable

log = logging.getLogger("orbit.grouping")

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")  # its answer


@attrs.define(eq=False)
class Waiting(Generic[I, R]):
    """An item waiting for its group's answer."""

    item: I
    keys: frozenset[str]
    size: int
    done: trio.Event = attrs.field(factory=trio.Event)
    taken: bool = False
    result: R | None = None
    error: BaseException | None = None

    def answer(self, result: R | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


@attrs.frozen
class GroupStatistics:
    # Group transactions run (committed or failed).
    groups: int
    # Items answered through groups, and their sizes summed.
    batches: int
    items: int
    # Items waiting for their lane's next group.
    pending: int
    # Groups that failed and were run again item by item.
    split: int


@attrs.define(eq=False, kw_only=True)
class GroupCommit(abc.ABC, Generic[I, R]):
    """Items per lane, a group per transaction (module docstring)."""

    # The most an item-size sum one group takes; an item is never split.
    max_group_size: int
    max_concurrent_groups: int
    # Per lane, the items waiting for its next group, in arrival order; a lane is in here
    # only while it has some (insertion order: first come first).
    _pending: dict[str, list[Waiting[I, R]]] = attrs.field(factory=dict, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _running: bool = attrs.field(default=False, init=False)
    # Per lane, the group its transaction is deciding now.
    _in_flight: dict[str, list[Waiting[I, R]]] = attrs.field(factory=dict, init=False)
    _groups: int = attrs.field(default=0, init=False)
    _batches: int = attrs.field(default=0, init=False)
    _items: int = attrs.field(default=0, init=False)
    _split: int = attrs.field(default=0, init=False)

    @abc.abstractmethod
    async def run_group(self, lane: str, items: Sequence[I]) -> list[R]:
        """One transaction deciding ``items`` (all of ``lane``): one answer each, in order."""

    def keys(self, item: I) -> frozenset[str]:
        """What ``item`` decides that no other item of its group may (default: nothing)."""
        return frozenset()

    def size(self, item: I) -> int:
        """How much of ``max_group_size`` the item takes (default 1)."""
        return 1

    async def submit(self, lane: str, item: I) -> R:
        """``item``'s answer once the group transaction that holds it has committed. Until
        ``run`` is running (and after it stopped), the item runs on a transaction of its own."""
        if not self._running:
            return (await self.run_group(lane, [item]))[0]
        waiting: Waiting[I, R] = Waiting(item, self.keys(item), self.size(item))
        self._pending.setdefault(lane, []).append(waiting)
        self._wake.set()
        try:
            await waiting.done.wait()
        except BaseException:
            # Cancelled before its group was formed: withdrawn. Once taken, the group's
            # transaction decides it; only the answer is lost.
            if not waiting.taken:
                left = self._pending.get(lane, [])
                left.remove(waiting)
                if not left:
                    self._pending.pop(lane, None)
            raise
        if waiting.error is not None:
            raise waiting.error
        return waiting.result  # type: ignore[return-value]

    def _take_group(self, lane: str) -> list[Waiting[I, R]]:
        """The pending items of one lane that form its next group, in arrival order."""
        group: list[Waiting[I, R]] = []
        named: set[str] = set()
        size = 0
        left: list[Waiting[I, R]] = []
        for waiting in self._pending.pop(lane, []):
            fits = not group or size + waiting.size <= self.max_group_size
            # Keep each caller's order: nothing overtakes an item left waiting that it meets.
            if fits and named.isdisjoint(waiting.keys) and all(w.keys.isdisjoint(waiting.keys) for w in left):
                waiting.taken = True
                group.append(waiting)
                named |= waiting.keys
                size += waiting.size
            else:
                left.append(waiting)
        if left:
            self._pending[lane] = left
        return group

    async def _commit(self, lane: str, group: list[Waiting[I, R]]) -> None:
        try:
            answers = await self.run_group(lane, [w.item for w in group])
        except Exception as exc:
            if len(group) == 1 or not isinstance(exc, OrbitError) or isinstance(exc, Unavailable):
                for waiting in group:
                    waiting.answer(error=exc)
                return
            # One item may be at fault: each runs alone so the others still commit.
            self._split += 1
            log.warning("group transaction of %d items failed (%s); running them one by one", len(group), exc)
            for waiting in group:
                try:
                    waiting.answer((await self.run_group(lane, [waiting.item]))[0])
                except OrbitError as alone:
                    waiting.answer(error=alone)
            return
        for waiting, answer in zip(group, answers, strict=True):
            waiting.answer(answer)

    def _startable(self) -> list[str]:
        """Lanes whose next group may start now, first come first."""
        room = self.max_concurrent_groups - len(self._in_flight)
        return [lane for lane in self._pending if lane not in self._in_flight][: max(0, room)]

    @staticmethod
    def _abandon(waiting: Iterable[Waiting[I, R]]) -> None:
        """The engine stops: these items get an error. A group cancelled mid-transaction
        may or may not have committed; what it decided is in the database either way."""
        for w in waiting:
            if not w.done.is_set():
                w.answer(error=Unavailable("the node's group commit stopped"))

    async def _run_group(self, lane: str, group: list[Waiting[I, R]]) -> None:
        try:
            await self._commit(lane, group)
        except BaseException:
            self._abandon(group)
            raise
        finally:
            del self._in_flight[lane]
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run groups until cancelled."""
        self._running = True
        try:
            async with trio.open_nursery() as groups:
                task_status.started()
                while True:
                    for lane in self._startable():
                        group = self._in_flight[lane] = self._take_group(lane)
                        self._groups += 1
                        self._batches += len(group)
                        self._items += sum(w.size for w in group)
                        groups.start_soon(self._run_group, lane, group)
                    # Until an item arrives or a group ends (no checkpoint since the last look).
                    self._wake = trio.Event()
                    await self._wake.wait()
                    # Let every caller made runnable in the same scheduler tick add its item.
                    await trio.lowlevel.checkpoint()
        finally:
            self._running = False
            # Every group has answered by now (``_run_group``); what still waits, nobody
            # will run.
            self._abandon(w for waiting in self._pending.values() for w in waiting)
            self._pending.clear()

    def statistics(self) -> GroupStatistics:
        return GroupStatistics(
            groups=self._groups,
            batches=self._batches,
            items=self._items,
            pending=sum(len(w) for w in self._pending.values()),
            split=self._split,
        )
