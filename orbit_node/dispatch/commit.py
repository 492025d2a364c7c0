"""Group commit: the transitions of many Worker connections share one transaction.

Each Worker connection sends its Start / renew / Finish / release batches here
instead of running a transaction of its own. While one group transaction runs, the
batches that arrive wait; the next transaction takes all of them (group commit, as
a database does with its log). Under load that turns one transaction per message
into one per commit time; a lone message waits for nothing but the commit ahead of
it.

What stays as it was:

* every row is still a compare-and-set on its fencing token, state and lease
  (``store.transitions``); a refused row is an outcome of its own and never fails the
  other rows of its batch or of the group;
* a batch is answered only after the transaction that holds it has committed;
* the batches of one group name distinct tasks. A batch that names a task another
  batch of the forming group already names waits for the next group, so each row
  is decided once per transaction, in arrival order.

When a group transaction fails with an error that is not the database being
unreachable, each of its batches is run again alone, so one batch's bad data cannot
fail the others. If the database cannot be reached, every batch of the group gets
that error (the connection answers its Worker with negative acks, as before).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs
import trio

from ..errors import OrbitError, Unavailable
from ..store.ownership import FinishItem, TransitionResult
from ..store.transitions import TransitionPart

log = logging.getLogger("orbit.commit")

# The most items one group transaction decides; a batch never is split.
MAX_GROUP_ITEMS = 2048


class PartStore(Protocol):
    """The dispatch store's transition parts (``store.dispatch.DispatchStore``)."""

    def start_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def renew_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def release_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def finish_part(self, items: Iterable[FinishItem]) -> TransitionPart: ...
    async def transition(self, parts: Sequence[TransitionPart]) -> list[list[TransitionResult]]: ...


@attrs.define(eq=False)
class _Batch:
    part: TransitionPart
    task_ids: frozenset[str]
    done: trio.Event = attrs.field(factory=trio.Event)
    taken: bool = False
    results: list[TransitionResult] | None = None
    error: BaseException | None = None

    def answer(self, results: list[TransitionResult] | None = None, error: BaseException | None = None) -> None:
        self.results, self.error = results, error
        self.done.set()


@attrs.frozen
class CommitStatistics:
    # Group transactions committed (or failed).
    groups: int
    # Batches answered, and the items in them.
    batches: int
    items: int
    # Batches waiting for the next group.
    pending: int
    # Groups that failed and were run again batch by batch.
    split: int


@attrs.define(eq=False)
class GroupCommitter:
    """Runs transition batches from many connections, a group per transaction.

    Has the same ``start_many`` / ``renew_many`` / ``release_many`` / ``finish_many``
    as the dispatch store, so a connection does not know which one it talks to. Until
    ``run`` is running (and after it stopped), a batch runs on its own transaction.
    """

    store: PartStore
    max_group_items: int = MAX_GROUP_ITEMS
    _pending: list[_Batch] = attrs.field(factory=list, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _running: bool = attrs.field(default=False, init=False)
    _in_flight: list[_Batch] = attrs.field(factory=list, init=False)
    _groups: int = attrs.field(default=0, init=False)
    _batches: int = attrs.field(default=0, init=False)
    _items: int = attrs.field(default=0, init=False)
    _split: int = attrs.field(default=0, init=False)

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.submit(self.store.start_part(items))

    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.submit(self.store.renew_part(items))

    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.submit(self.store.release_part(items))

    async def finish_many(self, items: Iterable[FinishItem]) -> list[TransitionResult]:
        return await self.submit(self.store.finish_part(items))

    async def submit(self, part: TransitionPart) -> list[TransitionResult]:
        """Answer ``part`` once the group transaction that holds it has committed."""
        if not part.items:
            return []
        if not self._running:
            return (await self.store.transition([part]))[0]
        batch = _Batch(part, frozenset(key[0] for key in part.keys()))
        self._pending.append(batch)
        self._wake.set()
        try:
            await batch.done.wait()
        except BaseException:
            # Cancelled (the connection ended) before its group was formed: withdrawn.
            # Once taken, the group's transaction decides it; only the answer is lost.
            if not batch.taken:
                self._pending.remove(batch)
            raise
        if batch.error is not None:
            raise batch.error
        assert batch.results is not None
        return batch.results

    def _take_group(self) -> list[_Batch]:
        """The pending batches that form the next group, in arrival order."""
        group: list[_Batch] = []
        named: set[str] = set()
        items = 0
        waiting: list[_Batch] = []
        for batch in self._pending:
            fits = not group or items + len(batch.part.items) <= self.max_group_items
            if (
                fits
                and named.isdisjoint(batch.task_ids)
                and not any(
                    # Keep a connection's order: nothing overtakes a batch left waiting
                    # that names the same tasks.
                    not w.task_ids.isdisjoint(batch.task_ids)
                    for w in waiting
                )
            ):
                batch.taken = True
                group.append(batch)
                named |= batch.task_ids
                items += len(batch.part.items)
            else:
                waiting.append(batch)
        self._pending = waiting
        return group

    async def _commit(self, group: list[_Batch]) -> None:
        try:
            answers = await self.store.transition([b.part for b in group])
        except Exception as exc:
            if len(group) == 1 or not isinstance(exc, OrbitError) or isinstance(exc, Unavailable):
                for batch in group:
                    batch.answer(error=exc)
                return
            # One batch may be at fault: each runs alone so the others still commit.
            self._split += 1
            log.warning("group transaction of %d batches failed (%s); running them one by one", len(group), exc)
            for batch in group:
                try:
                    batch.answer((await self.store.transition([batch.part]))[0])
                except OrbitError as alone:
                    batch.answer(error=alone)
            return
        for batch, results in zip(group, answers, strict=True):
            batch.answer(results)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit groups until cancelled."""
        self._running = True
        try:
            task_status.started()
            while True:
                if not self._pending:
                    self._wake = trio.Event()
                    await self._wake.wait()
                    # Let every connection made runnable in the same scheduler tick add its batch.
                    await trio.lowlevel.checkpoint()
                group = self._in_flight = self._take_group()
                self._groups += 1
                self._batches += len(group)
                self._items += sum(len(b.part.items) for b in group)
                await self._commit(group)
                self._in_flight = []
        finally:
            self._running = False
            # Nobody will commit these now: their connections answer with negative acks.
            # (A group cancelled mid-transaction may or may not have committed; its rows'
            # fencing tokens and leases keep ownership exact either way.)
            for batch in self._in_flight + self._pending:
                if not batch.done.is_set():
                    batch.answer(error=Unavailable("the node's group commit stopped"))
            self._in_flight = []
            self._pending.clear()

    def statistics(self) -> CommitStatistics:
        return CommitStatistics(
            groups=self._groups,
            batches=self._batches,
            items=self._items,
            pending=len(self._pending),
            split=self._split,
        )
